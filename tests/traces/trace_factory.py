"""Builds TraceRecords for the trace pipeline tests."""
from __future__ import annotations

import random
import time

from trace_pipeline.records import TraceRecord


def make_record(request_id: str, *, session_id: str = "s1", team: str = "team-a",
                model: str = "org/model-7b", policy_version: int = 1,
                prompt: list[int] | None = None, completion: list[int] | None = None,
                logprobs: list[float] | None = None, created_at: float | None = None,
                messages: list[dict] | None = None, output: dict | None = None,
                choice_index: int = 0) -> TraceRecord:
    prompt = [1, 2, 3] if prompt is None else prompt
    completion = [4, 5] if completion is None else completion
    if logprobs is None:
        rng = random.Random(request_id)
        logprobs = [-rng.random() * 3 for _ in completion]
    return TraceRecord(
        request_id=request_id, session_id=session_id, team=team, model=model,
        policy_version=policy_version, endpoint="chat.completions",
        created_at=time.time() if created_at is None else created_at,
        request_messages=messages if messages is not None else [{"role": "user", "content": "hi"}],
        tools=None, prompt_text=None,
        output_message=output if output is not None else {"role": "assistant", "content": "hello"},
        output_text=None, sampling_params={"temperature": 1.0, "max_tokens": 16},
        prompt_token_ids=list(prompt), completion_token_ids=list(completion),
        completion_logprobs=list(logprobs), finish_reason="stop", queue_ms=0.5, ttft_ms=12.0,
        inter_token_ms=[3.0] * max(0, len(completion) - 1), total_ms=20.0, cached_tokens=0,
        worker_ids=["worker-0"], choice_index=choice_index)
