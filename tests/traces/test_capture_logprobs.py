"""traces.capture_logprobs: with it off, a request that did not ask for logprobs is traced with its exact ids and
no logprobs (the engine was not asked for them), and its turn exports to RL with 0.0 where they would be."""

import numpy as np

from engine.contract import SampledToken
from rollout_server.serving.finished import ChoiceResult, FinishedGeneration
from rollout_server.tracing import trace_records
from trace_pipeline.settings import TraceSettings
from trace_pipeline.stitching import Turn, assemble


def traced(tokens: list[SampledToken]):
    choice = ChoiceResult(0, text="ab", tokens=tokens, finish_reason="length")
    generation = FinishedGeneration(
        request_id="cmpl-1", session_id="s", team="local", model="tiny-qwen2", endpoint="completions",
        policy_version=0, prompt_token_ids=[1, 2], choices=[choice], worker_id="w", prompt_tokens=2,
        completion_tokens=len(tokens), cached_tokens=0, created_at=0.0, ttft_s=0.1, inter_token_s=[0.01],
        total_s=0.2, request_body={"prompt": [1, 2]})
    [record] = trace_records(generation)
    return record


def test_only_traces_that_keep_logprobs_want_them_from_the_engine():
    assert TraceSettings().keeps_logprobs
    assert not TraceSettings(capture_logprobs=False).keeps_logprobs
    assert not TraceSettings(enabled=False).keeps_logprobs


def test_a_request_served_without_logprobs_is_traced_with_its_ids_and_exports_zeros():
    with_logprobs = traced([SampledToken(5, -0.5, []), SampledToken(6, -1.25, [])])
    ids_only = traced([SampledToken(5, None, []), SampledToken(6, None, [])])
    assert with_logprobs.completion_logprobs == [-0.5, -1.25]
    assert ids_only.completion_token_ids == [5, 6] and ids_only.completion_logprobs == []

    turn = Turn(np.array(ids_only.prompt_token_ids), np.array(ids_only.completion_token_ids),
                np.array(ids_only.completion_logprobs, dtype=np.float64), None)
    branch = assemble([turn])
    assert branch.token_ids.tolist() == [1, 2, 5, 6] and branch.mask.tolist() == [0, 0, 1, 1]
    assert branch.logprobs.tolist() == [0.0, 0.0, 0.0, 0.0]
