"""Every finished generation becomes trace records (one per choice), off the hot path.

The hook hands records to the trace pipeline in a background task, so a response
never waits for the trace's fsync; `close()` waits for the tasks still running.
"""

from __future__ import annotations

import asyncio
import logging

from rollout_server.serving.finished import ChoiceResult, FinishedGeneration
from trace_pipeline.capture import TraceCapture
from trace_pipeline.records import TraceRecord

log = logging.getLogger(__name__)

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "n", "seed", "stop", "stop_token_ids", "max_tokens",
                  "max_completion_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "logprobs", "top_logprobs", "tool_choice", "parallel_tool_calls", "response_format")


def trace_records(g: FinishedGeneration) -> list[TraceRecord]:
    body = g.request_body
    sampling = {k: body[k] for k in _SAMPLING_KEYS if k in body}
    sampling.update(body.get("sampling_params") or {})  # /inference/v1/generate
    return [_record(g, body, sampling, choice) for choice in g.choices]


def _record(g: FinishedGeneration, body: dict, sampling: dict, choice: ChoiceResult) -> TraceRecord:
    prompt = body.get("prompt")
    return TraceRecord(
        request_id=g.request_id, session_id=g.session_id, team=g.team, model=g.model,
        policy_version=g.policy_version, endpoint=g.endpoint, created_at=g.created_at,
        request_messages=body.get("messages"), tools=body.get("tools"),
        prompt_text=prompt if isinstance(prompt, str) else None,
        output_message=choice.message, output_text=choice.text, sampling_params=sampling,
        prompt_token_ids=g.prompt_token_ids, completion_token_ids=choice.token_ids,
        completion_logprobs=_logprobs(choice), finish_reason=choice.finish_reason,
        queue_ms=None, ttft_ms=g.ttft_s * 1000 if g.ttft_s is not None else None,
        inter_token_ms=[gap * 1000 for gap in g.inter_token_s], total_ms=g.total_s * 1000,
        cached_tokens=g.cached_tokens, worker_ids=[] if g.worker_id is None else [str(g.worker_id)],
        choice_index=choice.index, completion_policy_versions=_versions(g, choice),
    )


def _versions(g: FinishedGeneration, choice: ChoiceResult) -> list[int] | None:
    """Each token's policy version, or None when they are all the response's (no update while it ran)."""
    versions = [t.policy_version for t in choice.tokens]
    return None if all(v == g.policy_version for v in versions) else versions


def _logprobs(choice: ChoiceResult) -> list[float]:
    """The sampled tokens' logprobs; none when the engine was not asked for them (traces.capture_logprobs off),
    which the RL export reads as a turn without logprobs."""
    if any(t.logprob is None for t in choice.tokens):
        return []
    return [t.logprob for t in choice.tokens]


class TraceHook:
    def __init__(self, capture: TraceCapture):
        self.capture = capture
        self._pending: set[asyncio.Task] = set()

    async def __call__(self, generation: FinishedGeneration) -> None:
        task = asyncio.create_task(self._record_all(trace_records(generation)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _record_all(self, records: list[TraceRecord]) -> None:
        for record in records:
            try:
                await self.capture.record(record)
            except Exception:
                log.exception("trace record of request %s could not be written", record.request_id)

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await asyncio.to_thread(self.capture.close)
