"""Structural tags, checked by xgrammar once per tool set and then served from memory.

Agents send the same tools on every turn, so the tag is built and compiled once per
(format, tools, tool_choice, parallel_tool_calls) and reused. Compiling runs in a
worker thread (xgrammar releases the GIL), so a 128-tool compile never blocks the
event loop; concurrent requests for the same tool set share one compile.

Every grammar the front door compiles or checks (tool calls here, structured outputs in
rollout_server/structured.py) runs in this cache's own threads (`off_the_loop`), at most
`max_compiles` at once: a burst of distinct schemas waits its turn there instead of taking the
threads that tokenizing and database reads share. What they produce is kept in one cache bounded
in bytes (rollout_server/bounded_cache.py; an entry's size: its text's length, plus its key's),
since a client makes a grammar as large as its schema.

Without a compiler, the tag is checked the way vLLM's API server checks it
(`xgrammar.Grammar.from_structural_tag`, no tokenizer); with one
(`GrammarCache.for_tokenizer`) it is compiled to token masks, as the engine will.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import xgrammar

from rollout_server.bounded_cache import ByteBoundedCache
from rollout_server.tool_calls.base import ToolCallFormat
from rollout_server.tool_calls.request import ToolRequestError, validate_tool_request
from rollout_server.tool_calls.schema_keywords import refuse_unenforced_in_strict_tools
from rollout_server.tool_calls.structural_tag import xgrammar_reason


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    compile_seconds: float = 0.0  # summed over misses


def vllm_body_fragment(structural_tag_json: str | None) -> dict[str, Any]:
    """The request-body field that makes vLLM 0.32 enforce the tag (/v1/completions and
    /v1/chat/completions alike); {} when nothing is enforced."""
    if structural_tag_json is None:
        return {}
    return {"structured_outputs": {"structural_tag": structural_tag_json}}


T = TypeVar("T")
_MISSING = object()


class GrammarCache:
    def __init__(self, compiler: xgrammar.GrammarCompiler | None = None, budget_bytes: int = 64 * 2**20,
                 max_compiles: int = 2) -> None:
        """`budget_bytes`, `max_compiles`: settings limits_grammar_cache_mib, limits_max_grammar_compiles."""
        self.compiler = compiler
        self.stats = CacheStats()
        self.compiled: ByteBoundedCache[str, str | None] = ByteBoundedCache(budget_bytes)
        self._compiling: dict[str, asyncio.Future[str | None]] = {}  # tool sets being compiled, shared while they are
        self._threads = ThreadPoolExecutor(max_compiles, thread_name_prefix="grammar-compile")

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, budget_bytes: int = 64 * 2**20, max_compiles: int = 2) -> GrammarCache:
        """A cache that compiles token masks for this Hugging Face tokenizer."""
        tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
        return cls(xgrammar.GrammarCompiler(tokenizer_info, cache_enabled=False), budget_bytes, max_compiles)

    async def off_the_loop(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` in one of the compile threads; past `max_compiles` at once, it waits its turn."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, work, *args)

    def memoized(self, kind: str, source: str, make: Callable[[str], str | None]) -> str | None:
        """`make(source)`, made once per (kind, source) while it stays in the cache. Blocking: call it in a compile
        thread. A failure is not kept."""
        key = f"{kind}:{hashlib.sha256(source.encode()).hexdigest()}"
        made = self.compiled.get(key, _MISSING)
        if made is _MISSING:
            made = make(source)
            self.compiled.put(key, made, len(key) + len(made or ""))
        return made

    def ebnf_of(self, structural_tag_json: str) -> str:
        """The EBNF grammar of an xgrammar structural tag (kept: agents resend the same tools). Blocking."""
        return self.memoized("ebnf", structural_tag_json,
                             lambda tag: str(xgrammar.Grammar.from_structural_tag(tag)))

    async def get(self, tools: Any, choice: Any, parallel: bool | None,
                  fmt: ToolCallFormat | None) -> dict[str, Any]:
        """The vLLM body fragment for this request; raises ToolRequestError for bad input.

        Validation and compiling run in a thread, once per key; a hit costs one hash. Without a format (a
        model that cannot call tools renders them only) the tools are validated, and nothing is enforced.
        """
        key = "tools:" + cache_key(tools, choice, parallel, fmt)
        tag = self.compiled.get(key, _MISSING)
        if tag is not _MISSING:
            self.stats.hits += 1
            return vllm_body_fragment(tag)
        pending = self._compiling.get(key)
        if pending is None:
            self.stats.misses += 1
            pending = asyncio.ensure_future(self.off_the_loop(self._build, tools, choice, parallel, fmt))
            pending.add_done_callback(lambda done: self._keep(key, done))
            self._compiling[key] = pending
        else:
            self.stats.hits += 1
        # shield: one cancelled request must not cancel a compile others wait for.
        return vllm_body_fragment(await asyncio.shield(pending))

    def _build(self, tools: Any, choice: Any, parallel: bool | None, fmt: ToolCallFormat | None) -> str | None:
        validate_tool_request(tools, choice, parallel)
        if fmt is not None:
            refuse_unenforced_in_strict_tools(tools, fmt.json_arguments)
        structural_tag = fmt.structural_tag(tools, choice, parallel) if fmt else None
        if structural_tag is None:
            return None
        tag_json = json.dumps(structural_tag, ensure_ascii=False)
        started = time.perf_counter()
        try:
            if self.compiler is None:
                xgrammar.Grammar.from_structural_tag(tag_json)
            else:
                self.compiler.compile_structural_tag(tag_json)
        except (RuntimeError, ValueError) as error:
            raise ToolRequestError(f"the tools cannot be turned into a grammar: {xgrammar_reason(error)}",
                                   "tools") from None
        finally:
            self.stats.compile_seconds += time.perf_counter() - started
        return tag_json

    def _keep(self, key: str, done: asyncio.Future) -> None:
        """A finished compile's tag is kept; a failure is not (the next request compiles it again)."""
        del self._compiling[key]
        if not done.cancelled() and done.exception() is None:
            tag = done.result()
            self.compiled.put(key, tag, len(key) + len(tag or ""))


def cache_key(tools: Any, choice: Any, parallel: bool | None, fmt: ToolCallFormat | None) -> str:
    """A hash of everything the structural tag (and its validation) depends on.

    Keys are not sorted: agents resend identical tools, and sorting would double the
    cost of every hit; a reordered tool set is merely a miss.
    """
    request = [fmt.name if fmt else None, tools, choice, parallel]
    serialized = json.dumps(request, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(serialized.encode()).hexdigest()
