"""Generation: one engine request, from admission to the finish hooks.

A generation admits the request (rate limits), sends it through the dispatcher, waits for the first chunk
(so that errors are clean 4xx/503 before any response byte, and the serving worker is known for the
headers), then accumulates every choice: its text, exact token ids and logprobs, finish reason. Its rules:
- every token carries the policy version that sampled it, as the engine stamped it (weights can change while a
  request runs: docs/deploy.md); a token the engine left unstamped (a worker reached through Dynamo's HTTP
  frontend) gets the serving worker's version, and an adapter's tokens get the adapter's. The version stamped
  on a response as a whole is its first token's;
- engine errors become OpenAI errors here, in one place (`from_engine`);
- the engine request is put in its team's namespace here, in one place (serving/team_scope.py: the team's KV
  salt, its session and request ids); what the client sees, and the finish hooks record, are its own ids;
- the answer goes out at the chunk that makes it whole; the rest of the engine stream and the bookkeeping
  (metrics, usage, quotas, traces) run afterwards, in a task of their own (`ServingContext.after_answer`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import AsyncIterator, Callable

from engine.contract import ChoiceDelta, EngineChunk, EngineRequest
from engine.errors import EngineError
from engine.http_headers import header_value
from engine.ids import PolicyVersion, WorkerId
from finetune_deploy.served_models import ServedModel
from rollout_server.auth import Principal
from rollout_server.errors import APIError, from_engine, unavailable
from rollout_server.serving.context import ServingContext
from rollout_server.serving.finished import ChoiceResult, FinishedGeneration

log = logging.getLogger(__name__)


class Generation:
    """One engine request, from admission to its finish hooks.

    `prompt_param` names the client's field that held the prompt, in errors about it."""

    def __init__(self, ctx: ServingContext, engine_request: EngineRequest, *, who: Principal, endpoint: str,
                 request_body: dict, prompt_param: str = "prompt",
                 on_choice_finished: Callable[[ChoiceResult], None] | None = None):
        self.ctx = ctx
        self.req = engine_request
        self.who = who
        self.endpoint = endpoint
        self.request_body = request_body
        self.prompt_param = prompt_param
        self.on_choice_finished = on_choice_finished
        self.choices: dict[int, ChoiceResult] = {}
        self._as_sent = {"request_id": engine_request.request_id, "session_id": engine_request.session_id,
                         "cache_salt": engine_request.cache_salt}  # the client's, before TeamScope.scope
        ctx.teams.scope(engine_request, who.team)
        self._claimed = False  # whether this generation holds its request id in TeamScope
        served_by = ctx.target(engine_request.model, who)
        engine_request.model, engine_request.pool = served_by.model.id, served_by.pool
        self.served: ServedModel = served_by.model
        self.worker_id: WorkerId | None = None
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
        if self.req.min_policy_version is not None:
            self.req.allowed_workers = self._workers_at_least(self.req.min_policy_version)
        self.ctx.teams.claim(self.req.request_id, self.request_id)
        self._claimed = True
        if self.ctx.limiter:
            n = self.req.sampling.n
            try:
                await self.ctx.limiter.admit(self.who.key_prefix, self.req.request_id,
                                             len(self.req.prompt_token_ids) + self.req.max_tokens * n)
            except BaseException:
                self._release_id()
                raise
        self.ctx.metrics.request_started(self.endpoint)
        self._chunks = self.ctx.client.stream(self.req)
        try:
            self._peeked = await self._next_chunk()
        except BaseException:
            self._failed()
            raise

    def _workers_at_least(self, version: int) -> frozenset[WorkerId] | None:
        allowed = self.ctx.models.workers_at_least(self.served, PolicyVersion(version))
        if allowed is not None and not allowed:
            raise APIError(409, f"no worker serves {self.served.id!r} at policy version {version} or newer yet "
                                f"(it serves version {self.served.policy_version})",
                           param="min_policy_version", code="policy_version_unavailable")
        return allowed

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
        self._release_id()

    def _release_id(self) -> None:
        """Frees the request id for the team's next request: once its reservation is closed (settled by the
        finish hooks, or released), so that a new request under the same id never meets this one's."""
        if self._claimed:
            self._claimed = False
            self.ctx.teams.release(self.req.request_id)

    async def _next_chunk(self) -> EngineChunk | None:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        except EngineError as error:
            raise from_engine(error, self.req, self.prompt_param) from error
        self._observe(chunk)
        if any(d.finish_reason for d in chunk.deltas) and self.ctx.models.aborted_since(self.worker_id, self._start):
            raise unavailable("the request was aborted: its worker paused to load new weights; retry it")
        return chunk

    def _observe(self, chunk: EngineChunk) -> None:
        if chunk.worker_id is not None and chunk.worker_id != self.worker_id:
            self.worker_id = chunk.worker_id
            self.policy_version = self.ctx.models.version_served_by(self.served, self.worker_id)
            first = next((t.policy_version for d in chunk.deltas for t in d.tokens), None)
            if first is not None and self.served.parent is None:
                self.policy_version = first
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
        for token in delta.tokens:
            if token.policy_version is None or self.served.parent is not None:
                token.policy_version = self.policy_version
        choice.tokens.extend(delta.tokens)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason
            if self.on_choice_finished:
                self.on_choice_finished(choice)

    def first_index(self, delta: ChoiceDelta) -> int:
        """The index, among its choice's completion tokens, of the delta's first token (once accumulated)."""
        return len(self.choices[delta.index].tokens) - len(delta.tokens)

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
        try:
            await self._finish()
        finally:
            self._release_id()

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

    @property
    def request_id(self) -> str:
        """The request's id as its client knows it."""
        return self._as_sent["request_id"]

    def as_sent(self) -> EngineRequest:
        """The engine request with the client's ids and salt, as before it was put in its team's namespace: what a
        request derived from this one (a tool call's repair) is built from."""
        return dataclasses.replace(self.req, **self._as_sent)

    def finished(self) -> FinishedGeneration:
        choices = self.sorted_choices()
        completion = sum(len(c.tokens) for c in choices)
        return FinishedGeneration(
            request_id=self.request_id, engine_request_id=self.req.request_id,
            session_id=self._as_sent["session_id"] or "", team=self.who.team,
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

    @property
    def worker_text(self) -> str | None:
        """The serving worker's id as responses carry it (decimal text)."""
        return None if self.worker_id is None else str(self.worker_id)

    def response_headers(self) -> dict[str, str]:
        headers = {"x-request-id": header_value(self.request_id), "x-policy-version": str(self.policy_version),
                   "x-session-id": header_value(self._as_sent["session_id"] or ""), "x-pool": self.req.pool}
        if self.worker_id is not None:
            headers["x-worker-id"] = self.worker_text
        return headers

    def usage_dict(self) -> dict:
        finished_tokens = sum(len(c.tokens) for c in self.choices.values())
        completion = self.usage.completion_tokens if self.usage else finished_tokens
        prompt = len(self.req.prompt_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": self.usage.cached_tokens if self.usage else 0}}


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
        # handler a turn or two of the event loop later, a delay that grows with the load.
        return [await generations[0].run_to_end()]
    return list(await asyncio.gather(*(g.run_to_end() for g in generations)))
