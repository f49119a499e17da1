"""Rate limits per API key: requests per minute and tokens per minute.

Each key has two token buckets. A bucket holds up to one minute's allowance and
refills continuously (limit / 60 per second), so a key may burst a full minute's
allowance and then runs at the limit.

Every request is counted exactly once:

* `admit()` (before the request reaches the engine) takes 1 request and the tokens the
  request may use (prompt + n x max_tokens, as the caller computes them), or raises
  429 with a Retry-After after which the same request would be admitted; `admit_many()`
  does the same, all or nothing, for the engine requests of a multi-prompt completion;
* then exactly one of `settle()` (finished: the reservation is corrected to the tokens
  really used) or `release()` (rejected or failed after admission: everything is given
  back) closes the reservation; later calls for the same request id do nothing.

The buckets live in the memory of one front-door process: with several front-door
processes each enforces the limit on its own share of traffic, and a restart refills
them. Limits are stored per key prefix in the `key_limits` table (a NULL column means
"the default from settings", 0 means "no limit"); requests without a key (open local
mode) are not limited. A key's limits are trusted for `limits_cache_s`, then read again in a worker
thread (rollout_server/read_cache.py).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from sqlalchemy import BigInteger, Column, Float, MetaData, String, Table, delete, select
from sqlalchemy.engine import Engine

from rollout_server.errors import APIError
from rollout_server.read_cache import ReadCache
from rollout_server.serving.finished import FinishedGeneration
from rollout_server.settings import QuotaSettings

SECONDS_PER_MINUTE = 60.0
# Float refills may land a hair below a whole amount exactly at the promised time.
_ROUNDING_SLACK = 1e-9


_metadata = MetaData()
key_limits = Table(
    "key_limits", _metadata,
    Column("key_prefix", String(16), primary_key=True),
    Column("requests_per_min", BigInteger, nullable=True),   # NULL: default; 0: no limit
    Column("tokens_per_min", BigInteger, nullable=True),
    Column("updated_at", Float, nullable=False),
)


@dataclass(frozen=True)
class KeyLimits:
    requests_per_min: int | None   # None: no limit
    tokens_per_min: int | None


@dataclass
class Reservation:
    request_id: str
    key_prefix: str
    tokens: int


# ---- stored limits -------------------------------------------------------------------------

class KeyLimitStore:
    """Per-key limits in the key_limits table, merged with the defaults from settings."""

    def __init__(self, engine: Engine, defaults: QuotaSettings | None = None):
        self.engine = engine
        self.defaults = defaults or QuotaSettings()
        self._cache: ReadCache[str, KeyLimits] = ReadCache(self.defaults.limits_cache_s)
        _metadata.create_all(engine)

    def set(self, key_prefix: str, requests_per_min: int | None, tokens_per_min: int | None) -> None:
        """None: use the default; 0: no limit. Takes effect within limits_cache_s."""
        with self.engine.begin() as conn:  # delete + insert: an upsert every database understands
            conn.execute(delete(key_limits).where(key_limits.c.key_prefix == key_prefix))
            conn.execute(key_limits.insert().values(key_prefix=key_prefix, requests_per_min=requests_per_min,
                                                    tokens_per_min=tokens_per_min, updated_at=time.time()))
        self._cache.forget(key_prefix)

    async def limits_for(self, key_prefix: str) -> KeyLimits:
        return await self._cache.get(key_prefix, lambda: self._read(key_prefix))

    def _read(self, key_prefix: str) -> KeyLimits:
        with self.engine.connect() as conn:
            row = conn.execute(select(key_limits).where(key_limits.c.key_prefix == key_prefix)).first()
        stored_rpm = row.requests_per_min if row is not None else None
        stored_tpm = row.tokens_per_min if row is not None else None
        return KeyLimits(_effective(stored_rpm, self.defaults.requests_per_min),
                         _effective(stored_tpm, self.defaults.tokens_per_min))


def _effective(stored: int | None, default: int | None) -> int | None:
    if stored is None:
        return default
    return stored or None   # 0 stored: no limit


# ---- buckets -------------------------------------------------------------------------------

class TokenBucket:
    """Up to `per_min` units, refilled at per_min / 60 per second. The level goes below zero
    when a finished request used more than it reserved; later requests wait for that debt."""

    def __init__(self, per_min: int, now: float):
        self.per_min = per_min
        self.level = float(per_min)
        self.updated_at = now

    def refill(self, now: float, per_min: int) -> None:
        self.per_min = per_min
        elapsed = max(0.0, now - self.updated_at)
        self.level = min(float(per_min), self.level + elapsed * per_min / SECONDS_PER_MINUTE)
        self.updated_at = now

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` units are available (0 if they are now); refill() first."""
        missing = amount - self.level - _ROUNDING_SLACK
        return max(0.0, missing * SECONDS_PER_MINUTE / self.per_min)

    def take(self, amount: float) -> None:
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self.level = min(float(self.per_min), self.level + amount)


@dataclass
class _KeyBuckets:
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None


# ---- the limiter ---------------------------------------------------------------------------

class RateLimiter:
    def __init__(self, limits_for: Callable[[str], Awaitable[KeyLimits]], clock: Callable[[], float] = time.monotonic):
        self.limits_for = limits_for
        self.clock = clock
        self._buckets: dict[str, _KeyBuckets] = {}
        self._open: dict[str, Reservation] = {}
        self._lock = threading.Lock()

    async def admit(self, key_prefix: str | None, request_id: str, tokens: int) -> Reservation | None:
        """Reserves 1 request and `tokens` for the key, or raises 429. None when the request has no key."""
        reservations = await self.admit_many(key_prefix, {request_id: tokens})
        return reservations[0] if reservations else None

    async def admit_many(self, key_prefix: str | None, tokens_by_request_id: dict[str, int]) -> list[Reservation]:
        """All or nothing: one reservation per engine request (a multi-prompt completion has several),
        or a 429 whose Retry-After is long enough for all of them. [] when the request has no key."""
        if key_prefix is None:
            return []
        limits = await self.limits_for(key_prefix)
        requests, tokens = len(tokens_by_request_id), sum(tokens_by_request_id.values())
        with self._lock:
            buckets = self._refilled_buckets(key_prefix, limits)
            _refuse_if_too_large(limits, requests, tokens)
            wait_s = _seconds_until_admitted(buckets, requests, tokens)
            if wait_s > 0:
                raise _rate_limited(key_prefix, limits, wait_s)
            _take(buckets, requests=requests, tokens=tokens)
            reservations = [Reservation(rid, key_prefix, n) for rid, n in tokens_by_request_id.items()]
            self._open.update((r.request_id, r) for r in reservations)
            return reservations

    def settle(self, request_id: str, used_tokens: int) -> bool:
        """The request finished having used `used_tokens`; corrects its reservation. False if already closed."""
        with self._lock:
            reservation = self._open.pop(request_id, None)
            if reservation is None:
                return False
            buckets = self._buckets[reservation.key_prefix]
            if buckets.tokens is not None:
                buckets.tokens.give_back(reservation.tokens - used_tokens)
            return True

    def release(self, request_id: str) -> bool:
        """The request will not run (rejected after admission): gives its request and tokens back."""
        with self._lock:
            reservation = self._open.pop(request_id, None)
            if reservation is None:
                return False
            buckets = self._buckets[reservation.key_prefix]
            if buckets.requests is not None:
                buckets.requests.give_back(1)
            if buckets.tokens is not None:
                buckets.tokens.give_back(reservation.tokens)
            return True

    async def on_finish(self, generation: FinishedGeneration) -> None:
        """A `ServingContext.on_finish` hook: settles the request with the tokens it really used."""
        self.settle(generation.engine_request_id, generation.prompt_tokens + generation.completion_tokens)

    @property
    def open_reservations(self) -> int:
        return len(self._open)

    def _refilled_buckets(self, key_prefix: str, limits: KeyLimits) -> _KeyBuckets:
        now = self.clock()
        buckets = self._buckets.setdefault(key_prefix, _KeyBuckets())
        buckets.requests = _refilled(buckets.requests, limits.requests_per_min, now)
        buckets.tokens = _refilled(buckets.tokens, limits.tokens_per_min, now)
        return buckets


def _refilled(bucket: TokenBucket | None, per_min: int | None, now: float) -> TokenBucket | None:
    if per_min is None:
        return None
    if bucket is None:
        return TokenBucket(per_min, now)
    bucket.refill(now, per_min)
    return bucket


def _seconds_until_admitted(buckets: _KeyBuckets, requests: int, tokens: int) -> float:
    waits = [0.0]
    if buckets.requests is not None:
        waits.append(buckets.requests.seconds_until(requests))
    if buckets.tokens is not None:
        waits.append(buckets.tokens.seconds_until(tokens))
    return max(waits)


def _take(buckets: _KeyBuckets, requests: int, tokens: int) -> None:
    if buckets.requests is not None:
        buckets.requests.take(requests)
    if buckets.tokens is not None:
        buckets.tokens.take(tokens)


def _refuse_if_too_large(limits: KeyLimits, requests: int, tokens: int) -> None:
    # No wait would ever admit it, so no Retry-After: the client must ask for less.
    if limits.requests_per_min is not None and requests > limits.requests_per_min:
        raise APIError(429, f"Request too large: it holds {requests} prompts, more than this key's limit of "
                            f"{limits.requests_per_min} requests per minute. Send fewer prompts at once.",
                       param="prompt", code="request_too_large")
    if limits.tokens_per_min is not None and tokens > limits.tokens_per_min:
        raise APIError(429, f"Request too large: it may use {tokens} tokens (prompt + max_tokens), more than this "
                            f"key's limit of {limits.tokens_per_min} tokens per minute. "
                            "Reduce max_tokens or the prompt.",
                       param="max_tokens", code="request_too_large")


def _rate_limited(key_prefix: str, limits: KeyLimits, wait_s: float) -> APIError:
    retry_after = max(1, math.ceil(wait_s))
    return APIError(429, f"Rate limit reached for key {key_prefix}… (limits: {_describe(limits)}). "
                         f"Please retry after {retry_after} s.",
                    code="rate_limit_exceeded", headers={"Retry-After": str(retry_after)})


def _describe(limits: KeyLimits) -> str:
    parts = []
    if limits.requests_per_min is not None:
        parts.append(f"{limits.requests_per_min} requests/min")
    if limits.tokens_per_min is not None:
        parts.append(f"{limits.tokens_per_min} tokens/min")
    return ", ".join(parts)
