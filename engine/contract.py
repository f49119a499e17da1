"""The contract between the front door and the engine: one request in, a stream of chunks out.

The front door tokenizes every prompt itself, so a request carries token ids, and every chunk carries the
exact ids the worker sampled (with their logprobs when asked): what a client gets and what a trace records
is exactly what the engine consumed and produced.

Both ways to a deployment's workers implement `EngineClient`: Dynamo's frontend over HTTP
(engine/client/dynamo_http.py) and Dynamo's KV router inside the front door (engine/client/embedded_router.py).
Invariants of a stream, whichever client made it:
- chunks come in order; a choice's tokens are never repeated or reordered;
- a choice's last delta has its `finish_reason`; the chunk that finishes the last choice and knows the
  usage is `final`, and nothing after it changes the answer;
- a failure before any token raises `RefusedBeforeOutput` (engine/errors.py), later ones an `EngineError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Literal, Protocol, Sequence

from engine.ids import DEFAULT_POOL, PolicyVersion, PoolName, RequestId, SessionId, WorkerId


@dataclass(frozen=True)
class SamplingParams:
    """How a choice's tokens are sampled and where it stops, as vLLM's SamplingParams names them (the part this
    engine path applies). None leaves the engine's default."""

    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    # Where a choice stops
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    # How its text is written
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None

    def given(self) -> dict[str, Any]:
        """The fields set, by name."""
        return {name: value for name in SAMPLING_FIELDS if (value := getattr(self, name)) is not None}

    def sampler_options(self) -> dict[str, Any]:
        """The fields the sampler itself applies (Dynamo's `sampling_options`), set ones only."""
        return {name: value for name in SAMPLER_FIELDS if (value := getattr(self, name)) is not None}


SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingParams))
SAMPLER_FIELDS: tuple[str, ...] = SAMPLING_FIELDS[:SAMPLING_FIELDS.index("stop")]


@dataclass(frozen=True)
class GuidedDecoding:
    """A constraint the engine enforces on every token (xgrammar): `spec` is a JSON schema (json), a pattern
    (regex), the allowed strings (choice) or an EBNF grammar (grammar)."""

    kind: Literal["json", "regex", "choice", "grammar"]
    spec: Any


@dataclass
class EngineRequest:
    model: str
    request_id: RequestId | str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    top_logprobs: int = 0                # alternatives per position the client wants
    # The sampled tokens' logprobs, which cost the engine a pass over the vocabulary every step. Without them
    # (neither the client nor the traces want them) the ids come alone.
    logprobs: bool = True
    guided: GuidedDecoding | None = None
    session_id: SessionId | None = None  # keeps the session on the worker that holds its KV (engine/sessions.py)
    pool: PoolName = DEFAULT_POOL        # the capacity pool that serves it (engine/supervisor/pools.py)
    stream_interval: int = 1             # tokens a worker gathers per message (engine/stream_interval.py)
    cache_salt: str | None = None        # only requests with the same salt share cached KV
    max_policy_lag: int | None = None    # ends it (finish reason POLICY_LAG) once tokens come from weights more
                                         # than this many versions past its first token's (PolicyLag)
    min_policy_version: int | None = None  # serve it only on workers at this policy version or newer,
    allowed_workers: frozenset[WorkerId] | None = None  # which the front door names here (None: any worker)


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None                # None: not asked of the engine (EngineRequest.logprobs)
    top: list[tuple[int, float]]         # (id, logprob), most likely first; empty unless top_logprobs > 0
    policy_version: PolicyVersion | None = None  # the weights that sampled it, as the engine says (stamp_versions)


@dataclass
class ChoiceDelta:
    index: int
    text: str
    tokens: list[SampledToken]
    finish_reason: str | None


@dataclass
class EngineUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class EngineChunk:
    deltas: list[ChoiceDelta]
    usage: EngineUsage | None = None
    worker_id: WorkerId | None = None
    received_at: float = 0.0             # time.monotonic() when it arrived
    final: bool = False                  # every choice has finished and the usage is known: the answer is whole


class EngineClient(Protocol):
    """The front door's connection to one deployment's workers."""

    via: str  # how requests reach the workers, in words (GET /v1/pools)

    def stream_once(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Sends the request once and streams its chunks (the invariants above)."""
        ...

    async def close(self) -> None: ...


POLICY_LAG = "policy_lag"  # the finish reason of a request its staleness budget ended


class PolicyLag:
    """A request's staleness budget (`EngineRequest.max_policy_lag`): tokens are kept while the policy version
    that sampled them is at most `budget` past the version of the request's first token; the first one beyond
    ends the request, without it. A token with no version (not stamped by the engine) is kept."""

    def __init__(self, budget: int):
        self.budget = budget
        self.start: PolicyVersion | None = None

    def kept(self, tokens: list[SampledToken]) -> int:
        """How many of `tokens` (the next ones sampled, in order) are within the budget."""
        for i, token in enumerate(tokens):
            if token.policy_version is None:
                continue
            if self.start is None:
                self.start = token.policy_version
            elif token.policy_version - self.start > self.budget:
                return i
        return len(tokens)


def stamp_versions(tokens: list[SampledToken], first_index: int, runs: Sequence[Sequence] | None) -> None:
    """Stamps each token with the policy version of the engine's run it falls in.

    `runs` are the choice's [version label, first output index] pairs so far, in order (the worker's
    `weight_versions`, engine/worker/in_flight_updates.py); `first_index` is the first token's output index.
    A label that is not a version number (vLLM's "default": a worker that was never labelled) stamps nothing,
    and the front door falls back on the serving worker's version."""
    if not runs:
        return
    starts = [(int(first), PolicyVersion(int(label)) if str(label).isdigit() else None) for label, first in runs]
    run = 0
    for offset, token in enumerate(tokens):
        while run + 1 < len(starts) and starts[run + 1][0] <= first_index + offset:
            run += 1
        token.policy_version = starts[run][1]


def sampled_tokens(ids: Sequence[int], logprobs: Sequence[float] | None,
                   alternatives: Sequence[Iterable[tuple[int, float]] | None], top_logprobs: int) -> list[SampledToken]:
    """One message's sampled tokens, whichever way the engine sent them.

    `logprobs` is None when the request asked for none. Alternatives (id, logprob) are read only when the
    client asked for them (`top_logprobs` > 0); a position without any held the sampled token alone (our worker
    leaves such lists out: engine/worker/dynamo_worker.py), so the sampled token was the most likely.
    """
    if logprobs is None:
        return [SampledToken(token_id, None, []) for token_id in ids]
    if not top_logprobs:  # the default: every streamed token passes here
        return [SampledToken(token_id, float(lp), []) for token_id, lp in zip(ids, logprobs)]
    tokens = []
    for i, (token_id, lp) in enumerate(zip(ids, logprobs)):
        given = alternatives[i] if i < len(alternatives) else None
        top = sorted(((t, float(v)) for t, v in (given or [(token_id, lp)])), key=lambda pair: -pair[1])
        tokens.append(SampledToken(token_id, float(lp), top))
    return tokens
