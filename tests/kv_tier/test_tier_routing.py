"""The KV tier and Dynamo's router on the real stack: two vLLM workers with small caches and one
Mooncake tier. The workers announce what they saved (KV events, medium "CPU"), so a prompt evicted from
every worker's cache goes back to the worker that saved it; a session whose worker died finds its
prefix in the tier on the other worker."""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.kv_tier.settings import KvTierSettings
from rollout_server.harness.stack import free_port_block, start_stack
from tests.kv_tier.test_tier_stack import (
    BLOCK,
    KV_CACHE_GIB,
    LOADABLE_BLOCKS,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    TierStack,
    tokens,
)

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def two_worker_tier(tmp_path_factory):
    tier = KvTierSettings(enabled=True, capacity_gib=0.25, nvfp4=False, port_base=free_port_block(3, start=32400))
    stack = start_stack(
        tmp_path_factory.mktemp("tier-routing"), workers=2,
        extra_args=["--kv-cache-gib", repr(KV_CACHE_GIB), "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16"],
        extra_env=tier.as_env())
    yield TierStack(stack, tier, nvfp4=False)
    stack.stop()


def complete(ts: TierStack, prompt: list[int], session: str | None = None) -> httpx.Response:
    response = httpx.post(f"{ts.stack.url}/v1/completions", timeout=120,
                          headers={"X-Session-ID": session} if session else {},
                          json={"model": ts.stack.model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response


def cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def in_pairs(ts: TierStack, prompts: list[list[int]]) -> list[httpx.Response]:
    """Two at a time, concurrently: the router spreads a pair over the two workers by load."""
    with ThreadPoolExecutor(2) as threads:
        return [r for i in range(0, len(prompts), 2) for r in threads.map(lambda p: complete(ts, p), prompts[i:i + 2])]


def wait_saved(ts: TierStack, keys_at_least: int) -> None:
    deadline = time.monotonic() + 60
    while ts.metrics().keys < keys_at_least:
        assert time.monotonic() < deadline, f"blocks not saved: {ts.metrics()}"
        time.sleep(0.2)


def test_a_prefix_evicted_everywhere_goes_back_to_the_worker_holding_it_in_the_tier(two_worker_tier):
    ts = two_worker_tier
    prompts = [tokens(seed=10 + i) for i in range(4)]
    keys_before = ts.metrics().keys
    first = in_pairs(ts, prompts)
    saved_on = [r.headers["x-worker-id"] for r in first]
    assert len(set(saved_on)) == 2, f"the router put every prompt on one worker ({saved_on}): nothing to tell apart"
    wait_saved(ts, keys_before + 4 * LOADABLE_BLOCKS)

    in_pairs(ts, [tokens(seed=1000 + i) for i in range(12)])  # 12 x 31 blocks: both 96-block caches turn over

    # Sent grouped by the worker that saved them (A, A, B, B): neither a fixed nor an alternating
    # tie-break among equally loaded workers with no cached prefix would give that order.
    order = sorted(range(4), key=lambda i: saved_on[i])
    reads_before = ts.metrics().get_requests
    again = [complete(ts, prompts[i]) for i in order]
    assert [r.headers["x-worker-id"] for r in again] == [saved_on[i] for i in order]
    assert [cached(r) for r in again] == [LOADABLE_BLOCKS * BLOCK] * 4
    assert ts.metrics().get_requests - reads_before == 4 * LOADABLE_BLOCKS, "served from the workers' caches, not the tier"


def test_a_session_whose_worker_died_finds_its_prefix_in_the_tier_on_the_other(two_worker_tier):
    ts = two_worker_tier
    turn1 = tokens(seed=50)
    keys_before = ts.metrics().keys
    first = complete(ts, turn1, session="moving-session")
    wait_saved(ts, keys_before + LOADABLE_BLOCKS)
    workers = {w["instance_id"]: w for w in ts.stack.status()["workers"]}
    os.killpg(workers[first.headers["x-worker-id"]]["pid"], signal.SIGKILL)

    turn2 = turn1 + tokens(seed=51)[:200]                      # the next turn: the same prefix and more
    second = complete(ts, turn2, session="moving-session")
    assert second.headers["x-worker-id"] != first.headers["x-worker-id"]
    assert cached(second) >= LOADABLE_BLOCKS * BLOCK, "the other worker recomputed the session's prefix"
