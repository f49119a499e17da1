"""Rate limits per key: 429 with a Retry-After that is exactly long enough, every request
counted once (admission reserves, finish settles, release gives back), limits per key."""

import asyncio
import threading

import pytest
from fastapi import APIRouter
from sqlalchemy import create_engine

from rollout_server.errors import APIError
from rollout_server.quotas import KeyLimits, KeyLimitStore, RateLimiter
from rollout_server.serving.finished import FinishedGeneration
from rollout_server.settings import QuotaSettings
from tests.usage.support import ManualClock, client_for


def limiter_with(requests_per_min: int | None, tokens_per_min: int | None, clock: ManualClock) -> RateLimiter:
    async def limits_for(key_prefix: str) -> KeyLimits:
        return KeyLimits(requests_per_min, tokens_per_min)

    return RateLimiter(limits_for, clock=clock)


def admit(limiter: RateLimiter, key_prefix: str | None, request_id: str, tokens: int):
    return asyncio.run(limiter.admit(key_prefix, request_id, tokens))


def admit_many(limiter: RateLimiter, key_prefix: str, tokens_by_request_id: dict[str, int]):
    return asyncio.run(limiter.admit_many(key_prefix, tokens_by_request_id))


def retry_after_of(limiter: RateLimiter, request_id: str, tokens: int, key: str = "rs-key1") -> int:
    with pytest.raises(APIError) as refused:
        admit(limiter, key, request_id, tokens)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    return int(refused.value.headers["Retry-After"])


def test_requests_per_minute_retry_after_is_exactly_long_enough():
    clock = ManualClock()
    limiter = limiter_with(2, None, clock)
    admit(limiter, "rs-key1", "r1", 10)
    admit(limiter, "rs-key1", "r2", 10)
    retry_after = retry_after_of(limiter, "r3", 10)
    assert retry_after == 30   # 2 per minute: one request comes back every 30 s

    clock.advance(retry_after - 1)
    assert retry_after_of(limiter, "r3", 10) == 1
    clock.advance(1)
    assert admit(limiter, "rs-key1", "r3", 10) is not None


def test_tokens_per_minute_reserve_at_admission_and_are_corrected_at_finish():
    clock = ManualClock()
    limiter = limiter_with(None, 1000, clock)
    admit(limiter, "rs-key1", "r1", 600)           # prompt + max_tokens
    assert retry_after_of(limiter, "r2", 600) == 12   # 200 missing at 1000/min

    assert limiter.settle("r1", used_tokens=100)  # it used only 100: 500 come back
    assert admit(limiter, "rs-key1", "r2", 600) is not None


def test_a_request_that_used_more_than_it_reserved_leaves_a_debt():
    clock = ManualClock()
    limiter = limiter_with(None, 100, clock)
    admit(limiter, "rs-key1", "r1", 50)
    limiter.settle("r1", used_tokens=150)          # level 100 - 150 = -50
    assert retry_after_of(limiter, "r2", 10) == 36   # (10 + 50) tokens at 100/min


def test_release_gives_back_exactly_once():
    clock = ManualClock()
    limiter = limiter_with(1, None, clock)
    admit(limiter, "rs-key1", "r1", 5)
    assert limiter.release("r1") is True           # rejected by validation after admission
    assert limiter.release("r1") is False          # a second release gives nothing back
    admit(limiter, "rs-key1", "r2", 5)              # the released request's slot
    retry_after_of(limiter, "r3", 5)               # only one slot was given back
    assert limiter.open_reservations == 1


def test_settle_and_release_close_a_reservation_once_whichever_comes_first():
    clock = ManualClock()
    limiter = limiter_with(1, 100, clock)
    admit(limiter, "rs-key1", "r1", 60)
    assert limiter.settle("r1", used_tokens=60) is True
    assert limiter.settle("r1", used_tokens=0) is False   # no second correction
    assert limiter.release("r1") is False                  # a finished request is not given back
    assert retry_after_of(limiter, "r2", 60) == 60         # the one request per minute was used
    assert limiter.open_reservations == 0


def test_on_finish_settles_with_prompt_plus_completion_tokens():
    clock = ManualClock()
    limiter = limiter_with(None, 1000, clock)
    admit(limiter, "rs-key1", "chatcmpl-1", 900)
    finished = FinishedGeneration(
        request_id="chatcmpl-1", session_id="s", team="t", model="m", endpoint="chat.completions",
        policy_version=0, prompt_token_ids=[1] * 100, choices=[], worker_id=None, prompt_tokens=100,
        completion_tokens=50, cached_tokens=0, created_at=0.0, ttft_s=None, inter_token_s=[], total_s=1.0,
        request_body={}, engine_request_id="chatcmpl-1")
    asyncio.run(limiter.on_finish(finished))
    assert limiter.open_reservations == 0
    admit(limiter, "rs-key1", "chatcmpl-2", 850)    # 1000 - 150 used = 850 available
    assert retry_after_of(limiter, "chatcmpl-3", 1) == 1


def test_a_multi_prompt_request_is_admitted_all_or_nothing():
    clock = ManualClock()
    limiter = limiter_with(4, None, clock)
    admit(limiter, "rs-key1", "r0", 1)
    admit(limiter, "rs-key1", "r1", 1)
    with pytest.raises(APIError) as refused:    # three prompts, two request slots left
        admit_many(limiter, "rs-key1", {"cmpl-1-0": 5, "cmpl-1-1": 5, "cmpl-1-2": 5})
    assert refused.value.headers["Retry-After"] == "15"   # one more slot at 4/min
    assert limiter.open_reservations == 2                  # the refusal reserved nothing
    clock.advance(15)
    reservations = admit_many(limiter, "rs-key1", {"cmpl-1-0": 5, "cmpl-1-1": 5, "cmpl-1-2": 5})
    assert [r.request_id for r in reservations] == ["cmpl-1-0", "cmpl-1-1", "cmpl-1-2"]
    assert all(limiter.settle(r.request_id, 5) for r in reservations)   # each settles on its own finish
    with pytest.raises(APIError) as too_many:
        admit_many(limiter, "rs-key1", {f"cmpl-2-{i}": 1 for i in range(5)})
    assert too_many.value.code == "request_too_large" and "Retry-After" not in too_many.value.headers


def test_a_request_larger_than_the_limit_is_refused_without_retry_after():
    limiter = limiter_with(None, 1000, ManualClock())
    with pytest.raises(APIError) as refused:
        admit(limiter, "rs-key1", "r1", 1001)
    assert refused.value.status == 429 and refused.value.code == "request_too_large"
    assert "Retry-After" not in refused.value.headers
    assert admit(limiter, "rs-key1", "r2", 1000) is not None   # nothing was taken by the refusal


def test_keys_have_separate_buckets_and_keyless_requests_are_not_limited():
    clock = ManualClock()
    limiter = limiter_with(1, None, clock)
    admit(limiter, "rs-key1", "r1", 1)
    admit(limiter, "rs-key2", "r2", 1)
    retry_after_of(limiter, "r3", 1, key="rs-key1")
    assert admit(limiter, None, "r4", 10**9) is None


def test_stored_limits_override_the_defaults(database_url):
    store = KeyLimitStore(create_engine(database_url),
                          QuotaSettings(requests_per_min=60, tokens_per_min=10_000))
    assert asyncio.run(store.limits_for("rs-plain")) == KeyLimits(60, 10_000)
    store.set("rs-small", requests_per_min=5, tokens_per_min=None)   # NULL tokens: the default
    store.set("rs-free", requests_per_min=0, tokens_per_min=0)       # 0: no limit
    assert asyncio.run(store.limits_for("rs-small")) == KeyLimits(5, 10_000)
    assert asyncio.run(store.limits_for("rs-free")) == KeyLimits(None, None)
    store.set("rs-small", requests_per_min=7, tokens_per_min=100)
    assert asyncio.run(KeyLimitStore(store.engine, store.defaults).limits_for("rs-small")) == KeyLimits(7, 100)
    store.set("rs-huge", requests_per_min=2**40, tokens_per_min=2**50)   # 64-bit columns on every database
    assert asyncio.run(store.limits_for("rs-huge")) == KeyLimits(2**40, 2**50)


class ThreadRecordingLimitStore(KeyLimitStore):
    """Test double: a real limit store that notes which thread each database read ran on."""

    def __init__(self, engine, defaults: QuotaSettings):
        super().__init__(engine, defaults)
        self.read_on: list[threading.Thread] = []

    def _read(self, key_prefix: str) -> KeyLimits:
        self.read_on.append(threading.current_thread())
        return super()._read(key_prefix)


def test_limits_are_read_off_the_event_loop_once_per_cache_period(database_url):
    store = ThreadRecordingLimitStore(create_engine(database_url),
                                      QuotaSettings(requests_per_min=60, limits_cache_s=60))

    async def three_requests():
        return [await store.limits_for("rs-key1") for _ in range(3)], threading.current_thread()

    limits, loop_thread = asyncio.run(three_requests())
    assert limits == [KeyLimits(60, None)] * 3
    assert len(store.read_on) == 1 and store.read_on[0] is not loop_thread


def test_the_429_reaches_the_client_with_retry_after_and_openai_error_body():
    clock = ManualClock()
    limiter = limiter_with(3, None, clock)
    router = APIRouter()

    @router.post("/v1/limited")
    async def limited(request_id: str):
        await limiter.admit("rs-key1", request_id, 1)
        return {"ok": True}

    client = client_for(router)
    assert [client.post("/v1/limited", params={"request_id": f"r{i}"}).status_code for i in range(3)] == [200] * 3
    refused = client.post("/v1/limited", params={"request_id": "r3"})
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "20"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
