"""What one request produced, as the finish hooks (metrics, usage, quotas, traces) read it.

A `FinishedGeneration` is built once, after the answer went out, from what the engine streamed: its
token ids and logprobs are exactly the engine's, its choices' texts and messages exactly what the client got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

from engine.contract import SampledToken
from engine.ids import DEFAULT_POOL, PolicyVersion, PoolName, RequestId, SessionId, WorkerId


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


def policy_versions(tokens: list[SampledToken], first_index: int = 0) -> list[dict]:
    """A choice's `policy_versions` field: which policy version sampled which of `tokens`, as runs
    [{"version": V, "first_token_index": i}, ...]; a run lasts up to the next one's first token.

    `first_index` is the index of tokens[0] among the choice's completion tokens (a streamed chunk carries a
    slice). Every token is stamped (Generation._accumulate), so there is one run unless the weights were
    updated while the request ran (an in-flight update, docs/deploy.md)."""
    runs: list[dict] = []
    for offset, token in enumerate(tokens):
        if not runs or runs[-1]["version"] != token.policy_version:
            runs.append({"version": token.policy_version, "first_token_index": first_index + offset})
    return runs


@dataclass
class FinishedGeneration:
    request_id: RequestId | str        # as the client knows it
    session_id: SessionId | str        # as the client named it
    team: str
    model: str
    endpoint: str                      # "chat.completions" | "completions" | "generate"
    policy_version: PolicyVersion
    prompt_token_ids: list[int]
    choices: list[ChoiceResult]
    worker_id: WorkerId | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    created_at: float                  # unix seconds
    ttft_s: float | None
    inter_token_s: list[float]
    total_s: float
    request_body: dict
    key_prefix: str | None = None      # None: open local mode (no key)
    pool: PoolName = DEFAULT_POOL
    engine_request_id: str = ""        # as the engine and the rate limiter know it: scoped by team (team_scope.py)


FinishHook = Callable[[FinishedGeneration], Awaitable[None]]
