"""The data that crosses the trace pipeline's boundaries.

`TraceRecord` is what the front door hands to `TraceCapture.record()`: one
choice of one request, with everything needed to train on it later.
`RewardRecord` is one row of the append-only rewards side table.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TraceRecord:
    request_id: str
    session_id: str
    team: str
    model: str
    policy_version: int
    endpoint: str                            # "chat.completions" | "completions" | "generate"
    created_at: float                        # unix seconds
    request_messages: list[dict] | None
    tools: list[dict] | None
    prompt_text: str | None                  # completions endpoint
    output_message: dict | None              # {"role": "assistant", "content": ..., "tool_calls": [...]}
    output_text: str | None
    sampling_params: dict
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str | None
    queue_ms: float | None
    ttft_ms: float | None
    inter_token_ms: list[float]
    total_ms: float
    cached_tokens: int
    worker_ids: list[str]
    choice_index: int = 0                    # n>1 gives several records with the same request_id
    # 1 = trained on, 0 = not, per completion token. None means all ones (everything
    # the engine sampled). Imported traces (verifiers) may mask some sampled tokens.
    completion_mask: list[int] | None = None
    source: str = "capture"                  # "capture" | "verifiers"
    # The policy version that sampled each completion token. None means all `policy_version`; a list only
    # when the weights changed while the request ran (an in-flight update).
    completion_policy_versions: list[int] | None = None
    # The free-form fields this record lost because they could not be redacted or encoded (set to None instead of
    # losing the whole record and its neighbours: trace_pipeline/salvage.py). None: nothing dropped.
    dropped_fields: list[str] | None = None


@dataclass
class RewardRecord:
    """Reward, advantage and metrics for one trace (request_id) or a whole session.

    Exactly one of request_id / session_id names the target. choice_index narrows a
    request-level reward to one choice; None applies it to every choice.
    """
    reward_id: str
    team: str
    created_at: float
    request_id: str | None = None
    session_id: str | None = None
    choice_index: int | None = None
    reward: float | None = None
    advantage: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
