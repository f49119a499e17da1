"""One generation through the engine, shared by chat, completions and generate.

`Generation` owns a request's life: it resolves the session, sends the request to
Dynamo, times the tokens (TTFT, inter-token latency), accumulates every choice
(text, exact token ids, logprobs, finish reason) and, at the end, accounts the
request in the metrics and hands the finished record to the `on_finish` hooks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Coroutine

import msgspec

from engine.frontend_client import ChoiceDelta, EngineChunk, EngineRequest, SampledToken
from engine.pool_config import DEFAULT_POOL, PoolConfig
from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request, unavailable
from rollout_server.event_stream import DONE
from rollout_server.http_headers import header_value
from rollout_server.metrics import Metrics
from rollout_server.pool_access import Route, route
from rollout_server.protocol import SamplingFields, StreamOptions
from rollout_server.quotas import RateLimiter
from rollout_server.served_models import ModelTable, ServedModel
from rollout_server.settings import Settings
from rollout_server.tokenizer import ModelTokenizer
from rollout_server.tool_calls import GrammarCache, ToolCallFormat

if TYPE_CHECKING:
    from engine.routing import PoolRouter

log = logging.getLogger(__name__)

_PASSED_THROUGH = ("temperature", "top_p", "top_k", "min_p", "n", "seed", "stop", "stop_token_ids",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
                   "skip_special_tokens", "include_stop_str_in_output")


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    tokens: list[SampledToken] = field(default_factory=list)
    finish_reason: str | None = None
    message: dict | None = None        # chat: the assistant message as the client saw it (tool calls parsed)

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]


@dataclass
class FinishedGeneration:
    """Everything one request produced: what metrics, headers and traces are built from."""

    request_id: str
    session_id: str
    team: str
    model: str
    endpoint: str
    policy_version: int
    prompt_token_ids: list[int]
    choices: list[ChoiceResult]
    worker_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    created_at: float
    ttft_s: float | None
    inter_token_s: list[float]
    total_s: float
    request_body: dict
    key_prefix: str | None = None
    pool: str = "default"


FinishHook = Callable[[FinishedGeneration], Awaitable[None]]


@dataclass
class ServingContext:
    """What every endpoint needs: built once by the app, shared by all requests."""

    settings: Settings
    tokenizer: ModelTokenizer
    client: "PoolRouter"                          # engine/routing.py: a request -> a healthy deployment of its pool
    metrics: Metrics
    models: ModelTable                            # the base model, LoRA adapters, each worker's policy version
    max_model_len: int
    on_finish: list[FinishHook] = field(default_factory=list)
    tool_format: ToolCallFormat | None = None     # from the chat template; None: the model cannot call tools
    grammars: GrammarCache = field(default_factory=GrammarCache)
    limiter: RateLimiter | None = None            # per-key requests/min and tokens/min
    pools: dict[str, PoolConfig] = field(  # name -> config, the default pool included
        default_factory=lambda: {DEFAULT_POOL: PoolConfig(name=DEFAULT_POOL, kind="shared")})

    _wrapping_up: set[asyncio.Task] = field(default_factory=set, init=False, repr=False)

    @property
    def model_name(self) -> str:
        return self.models.base.id

    def after_answer(self, wrap_up: Coroutine[Any, Any, None]) -> None:
        """Runs a request's wrap-up in a task of its own: it starts once the request's task has answered."""
        task = asyncio.get_running_loop().create_task(wrap_up)
        self._wrapping_up.add(task)
        task.add_done_callback(self._wrapping_up.discard)

    async def wrapped_up(self) -> None:
        """Waits for the wrap-ups still running (at shutdown, before the stores their hooks write to close)."""
        while self._wrapping_up:
            await asyncio.gather(*self._wrapping_up, return_exceptions=True)

    def route(self, model_field: str, who: Principal) -> Route:
        """The served model and pool a request's `model` names (404 unknown, 403 another team's pool)."""
        return route(model_field, who, self.pools, self.models)


def session_id_for(header: str | None, session_field: str | None, user: str | None) -> str:
    """X-Session-ID, else the body's `session_id` (vLLM's field), else the OpenAI `user`, else a new session."""
    return header or session_field or user or f"sess-{random_hex()}"


def sampling_for(ctx: ServingContext, fields: SamplingFields, max_tokens: int, param_prefix: str = "") -> dict:
    """The sampling fields passed to the engine, checked where they depend on the model or on max_tokens
    (the engine would refuse them with no field named)."""
    if fields.min_tokens is not None and fields.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({fields.min_tokens}) must be at most max_tokens ({max_tokens})",
                          param=f"{param_prefix}min_tokens")
    check_in_vocabulary(ctx, fields.stop_token_ids or [], f"{param_prefix}stop_token_ids")
    return {name: getattr(fields, name) for name in _PASSED_THROUGH if getattr(fields, name) is not None}


def stream_interval_for(ctx: ServingContext, streamed: bool, requested: int | None = None) -> int:
    """Tokens per engine message: a streamed response goes at the client's pace (the request's `stream_interval`,
    else the server's); a whole one needs only its end."""
    if not streamed:
        return ctx.settings.unstreamed_interval
    return requested or ctx.settings.stream_interval


def check_in_vocabulary(ctx: ServingContext, ids: list[int], param: str) -> None:
    bad = ctx.tokenizer.out_of_vocab(ids)
    if bad is not None:
        raise bad_request(f"Token id {bad} is out of vocabulary (vocabulary size {ctx.tokenizer.vocab_size}).",
                          param=param, code="token_out_of_vocabulary")


def check_prompt_chars(ctx: ServingContext, chars: int, prompt_param: str) -> None:
    """Refuses a text prompt surely over the context window before it is tokenized."""
    at_least = ctx.tokenizer.fewest_tokens(chars)
    if at_least > ctx.max_model_len:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt "
                          f"has at least {at_least} tokens ({chars} characters).", param=prompt_param,
                          code="context_length_exceeded")


def check_prompt(ctx: ServingContext, prompt_ids: list[int], max_tokens: int | None, prompt_param: str,
                 max_tokens_param: str = "max_tokens") -> int:
    """Validates the prompt against the vocabulary and context window; returns the max_tokens to use
    (`max_tokens_param`: the client's field that set it, named in errors)."""
    check_in_vocabulary(ctx, prompt_ids, prompt_param)
    room = ctx.max_model_len - len(prompt_ids)
    if room <= 0:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt "
                          f"has {len(prompt_ids)} tokens.", param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        return min(room, ctx.settings.default_max_tokens or room)
    if max_tokens > room:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, you requested "
                          f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} for the "
                          f"completion). Please reduce the length of the prompt or max_tokens.",
                          param=max_tokens_param, code="context_length_exceeded")
    return max_tokens


class Generation:
    def __init__(self, ctx: ServingContext, engine_request: EngineRequest, *, who: Principal, endpoint: str,
                 request_body: dict, on_choice_finished: Callable[[ChoiceResult], None] | None = None):
        self.ctx = ctx
        self.req = engine_request
        self.who = who
        self.endpoint = endpoint
        self.request_body = request_body
        self.on_choice_finished = on_choice_finished
        self.choices: dict[int, ChoiceResult] = {}
        served_by = ctx.route(engine_request.model, who)
        engine_request.model, engine_request.pool = served_by.model, served_by.pool
        self.served: ServedModel = ctx.models.resolve(served_by.model)
        self.worker_id: str | None = None
        self.policy_version = self.served.policy_version  # until the serving worker is known
        self.usage = None
        self.created_at = time.time()
        self._start = time.monotonic()
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._inter_token: list[float] = []
        self._chunks: AsyncIterator[EngineChunk] | None = None
        self._peeked: EngineChunk | None = None

    async def start(self) -> None:
        """Admits the request (rate limits), sends it and waits for the engine's first chunk, so errors
        surface before any response byte is sent and the serving worker is known for the headers."""
        if self.ctx.limiter:
            n = self.req.sampling.get("n", 1)
            await self.ctx.limiter.admit(self.who.key_prefix, self.req.request_id,
                                         len(self.req.prompt_token_ids) + self.req.max_tokens * n)
        self.ctx.metrics.request_started(self.endpoint)
        self._chunks = self.ctx.client.stream(self.req)
        try:
            self._peeked = await self._next_chunk()
        except BaseException:
            self._failed()
            raise

    async def abort(self) -> None:
        """Gives up a started generation (another part of the same request failed)."""
        if self._chunks is not None:
            await self._chunks.aclose()
            self._chunks = None
            self._failed()

    def _failed(self) -> None:
        self.ctx.metrics.request_finished(self.endpoint, ok=False)
        if self.ctx.limiter:
            self.ctx.limiter.release(self.req.request_id)

    async def _next_chunk(self) -> EngineChunk | None:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        self._observe(chunk)
        if any(d.finish_reason for d in chunk.deltas) and self.ctx.models.aborted_since(self.worker_id, self._start):
            raise unavailable("the request was aborted: its worker paused to load new weights; retry it")
        return chunk

    def _observe(self, chunk: EngineChunk) -> None:
        if chunk.worker_id and chunk.worker_id != self.worker_id:
            self.worker_id = chunk.worker_id
            # Stamped when the worker is known, before its first token: deploys pause a worker and let its
            # requests finish before they load new weights, so a request runs on one version throughout.
            self.policy_version = self.ctx.models.version_served_by(self.served, self.worker_id)
        if chunk.usage:
            self.usage = chunk.usage
        new_tokens = 0
        for delta in chunk.deltas:
            new_tokens += len(delta.tokens)
            self._accumulate(delta)
        if new_tokens:
            now = chunk.received_at
            if self._first_token_at is None:
                self._first_token_at = now
            elif self._last_token_at is not None:  # a message may carry several tokens (stream_interval)
                self._inter_token += [(now - self._last_token_at) / new_tokens] * new_tokens
            self._last_token_at = now

    def _accumulate(self, delta: ChoiceDelta) -> None:
        choice = self.choices.get(delta.index)
        if choice is None:
            choice = self.choices[delta.index] = ChoiceResult(delta.index)
        choice.text += delta.text
        choice.tokens.extend(delta.tokens)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason
            if self.on_choice_finished:
                self.on_choice_finished(choice)

    async def chunks(self) -> AsyncIterator[EngineChunk]:
        """The engine's chunks, in order (the first was already read by start()), up to the one that makes the
        answer whole (`EngineChunk.final`). What follows it, the end of the engine stream and the request's
        bookkeeping, runs after the caller has answered the client (`_wrap_up`)."""
        ok = False
        try:
            chunk = self._peeked
            while chunk is not None:
                yield chunk
                if chunk.final:
                    break
                chunk = await self._next_chunk()
            ok = True
        finally:
            if ok:
                self.ctx.after_answer(self._wrap_up())
            else:
                self._failed()

    async def _wrap_up(self) -> None:
        """Reads the engine stream to its end (nothing more is left in it, usually) and runs the finish hooks.
        The answer does not wait for it: when several requests end at once, each answer goes out before any of
        their bookkeeping, and each client can send its next request sooner."""
        try:
            async for _ in self._chunks:
                pass
        except Exception as exc:
            log.warning("request %s: its engine stream failed after the answer was whole: %s", self.req.request_id, exc)
        self.ctx.metrics.request_finished(self.endpoint, ok=True)
        await self._finish()

    async def run_to_end(self) -> list[ChoiceResult]:
        async for _ in self.chunks():
            pass
        return self.sorted_choices()

    def sorted_choices(self) -> list[ChoiceResult]:
        return [self.choices[i] for i in sorted(self.choices)]

    async def _finish(self) -> None:
        finished = self.finished()
        self.ctx.metrics.observe_generation(finished)
        for hook in self.ctx.on_finish:
            try:
                await hook(finished)
            except Exception:
                log.exception("finish hook failed for request %s", self.req.request_id)

    def finished(self) -> FinishedGeneration:
        choices = self.sorted_choices()
        completion = sum(len(c.tokens) for c in choices)
        return FinishedGeneration(
            request_id=self.req.request_id, session_id=self.req.session_id or "", team=self.who.team,
            model=self.req.model, endpoint=self.endpoint, policy_version=self.policy_version,
            prompt_token_ids=self.req.prompt_token_ids, choices=choices, worker_id=self.worker_id,
            prompt_tokens=len(self.req.prompt_token_ids),
            completion_tokens=self.usage.completion_tokens if self.usage else completion,
            cached_tokens=self.usage.cached_tokens if self.usage else 0,
            created_at=self.created_at,
            ttft_s=(self._first_token_at - self._start) if self._first_token_at else None,
            inter_token_s=self._inter_token, total_s=time.monotonic() - self._start,
            request_body=self.request_body, key_prefix=self.who.key_prefix, pool=self.req.pool,
        )

    def response_headers(self) -> dict[str, str]:
        headers = {"x-request-id": header_value(self.req.request_id), "x-policy-version": str(self.policy_version),
                   "x-session-id": header_value(self.req.session_id or ""), "x-pool": self.req.pool}
        if self.worker_id:
            headers["x-worker-id"] = self.worker_id
        return headers

    def usage_dict(self) -> dict:
        finished_tokens = sum(len(c.tokens) for c in self.choices.values())
        completion = self.usage.completion_tokens if self.usage else finished_tokens
        prompt = len(self.req.prompt_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": self.usage.cached_tokens if self.usage else 0}}


def running_usage_of(generation: Generation, wanted: bool) -> dict:
    """The usage so far, as a streamed chunk's `usage` field, when the client asked for it in every chunk."""
    return {"usage": generation.usage_dict()} if wanted else {}


def sse(payload: dict) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def streamed_answer(generation: Generation, base: dict, options: StreamOptions | None,
                          events_of: Callable[[EngineChunk], list[bytes]]) -> AsyncIterator[bytes]:
    """A streamed answer's body: each engine chunk's events (`events_of`) in one piece. The chunk that makes the
    answer whole carries the stream's end (the usage, when the client asked for it, and [DONE]), so the
    response ends in the same write (rollout_server/event_stream.py); an error ends it with an error event."""
    ended = False
    try:
        async for chunk in generation.chunks():
            events = events_of(chunk)
            if chunk.final:
                events.append(_stream_end(generation, base, options))
                ended = True
            if events:
                yield b"".join(events)
        if not ended:
            yield _stream_end(generation, base, options)
    except APIError as err:
        yield sse(err.body()) + DONE


def _stream_end(generation: Generation, base: dict, options: StreamOptions | None) -> bytes:
    usage = sse({**base, "choices": [], "usage": generation.usage_dict()}) if options and options.include_usage else b""
    return usage + DONE


def random_hex() -> str:
    """128 random bits, as uuid4().hex carries, without building a UUID (a quarter of the time, per request)."""
    return secrets.token_hex(16)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{random_hex()}"


async def start_all(generations: list[Generation]) -> None:
    """Starts every generation of one request, or none: a failure aborts those already started."""
    for i, generation in enumerate(generations):
        try:
            await generation.start()
        except BaseException:
            for started in generations[:i]:
                await started.abort()
            raise


async def gather_generations(generations: list[Generation]) -> list[list[ChoiceResult]]:
    if len(generations) == 1:
        # In the request's own task: gather() would run it in a task of its own, and its end would reach the
        # handler a turn or two of the event loop later (3-4 ms per whole response under load).
        return [await generations[0].run_to_end()]
    return list(await asyncio.gather(*(g.run_to_end() for g in generations)))
