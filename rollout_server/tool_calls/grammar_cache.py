"""Structural tags, checked by xgrammar once per tool set and then served from memory.

Agents send the same tools on every turn, so the tag is built and compiled once per
(format, tools, tool_choice, parallel_tool_calls) and reused. Compiling runs in a
worker thread (xgrammar releases the GIL), so a 128-tool compile never blocks the
event loop; concurrent requests for the same tool set share one compile.

Without a compiler, the tag is checked the way vLLM's API server checks it
(`xgrammar.Grammar.from_structural_tag`, no tokenizer); with one
(`GrammarCache.for_tokenizer`) it is compiled to token masks, as the engine will.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import xgrammar

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


class GrammarCache:
    def __init__(self, compiler: xgrammar.GrammarCompiler | None = None, max_entries: int = 512) -> None:
        self.compiler = compiler
        self.max_entries = max_entries
        self.stats = CacheStats()
        self._tags: OrderedDict[str, asyncio.Future[str | None]] = OrderedDict()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_entries: int = 512) -> GrammarCache:
        """A cache that compiles token masks for this Hugging Face tokenizer."""
        tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
        return cls(xgrammar.GrammarCompiler(tokenizer_info, cache_enabled=False), max_entries)

    async def get(self, tools: Any, choice: Any, parallel: bool | None,
                  fmt: ToolCallFormat | None) -> dict[str, Any]:
        """The vLLM body fragment for this request; raises ToolRequestError for bad input.

        Validation and compiling run in a thread, once per key; a hit costs one hash. Without a format (a
        model that cannot call tools renders them only) the tools are validated, and nothing is enforced.
        """
        key = cache_key(tools, choice, parallel, fmt)
        pending = self._tags.get(key)
        if pending is None:
            self.stats.misses += 1
            pending = asyncio.ensure_future(asyncio.to_thread(self._build, tools, choice, parallel, fmt))
            pending.add_done_callback(lambda done: self._forget_failure(key, done))
            self._remember(key, pending)
        else:
            self.stats.hits += 1
            self._tags.move_to_end(key)
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

    def _remember(self, key: str, pending: asyncio.Future) -> None:
        self._tags[key] = pending
        while len(self._tags) > self.max_entries:
            self._tags.popitem(last=False)

    def _forget_failure(self, key: str, done: asyncio.Future) -> None:
        if (done.cancelled() or done.exception() is not None) and self._tags.get(key) is done:
            del self._tags[key]


def cache_key(tools: Any, choice: Any, parallel: bool | None, fmt: ToolCallFormat | None) -> str:
    """A hash of everything the structural tag (and its validation) depends on.

    Keys are not sorted: agents resend identical tools, and sorting would double the
    cost of every hit; a reordered tool set is merely a miss.
    """
    request = [fmt.name if fmt else None, tools, choice, parallel]
    serialized = json.dumps(request, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(serialized.encode()).hexdigest()
