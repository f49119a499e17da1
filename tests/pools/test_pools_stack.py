"""Reserved and serverless pools on the real stack: a reserved pool serves only its team (403 for the
others), a serverless pool starts a real Dynamo vLLM worker when a request arrives at zero and stops
it when idle; usage is recorded per pool and equals what the responses reported; a key's rate limit
answers 429 with Retry-After."""

import subprocess
import sys
import time

import httpx
import pytest

from rollout_server.harness.pool_stack import MODEL, auth, chat, pools, start_pool_stack, wait_for
from rollout_server.harness.stack import REPO

pytestmark = pytest.mark.stack

POOLS = """
[pools.team-a]
kind = "reserved"
team = "team-a"
workers = 1

[pools.burst]
kind = "serverless"
min_workers = 0
max_workers = 1
idle_s = 15
cold_start_timeout_s = 300
"""


@pytest.fixture(scope="module")
def pool_stack(tmp_path_factory):
    stack, keys = start_pool_stack(tmp_path_factory.mktemp("pools"), POOLS, deployments=2,
                                   teams=("team-a", "team-b", "metered", "limited"),
                                   limits={"limited": ("--requests-per-min", "3")},
                                   extra_env={"ROLLOUT_SERVE_USAGE__FLUSH_EVERY_S": "0.5"})
    yield stack, keys
    stack.stop()


def test_a_reserved_pool_serves_its_team_and_refuses_the_others(pool_stack):
    stack, keys = pool_stack
    refused = chat(stack.url, f"{MODEL}@team-a", keys["team-b"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["param"] == "model" and refused.json()["error"]["code"] == "pool_reserved"

    own = chat(stack.url, MODEL, keys["team-a"])           # a team's own reserved pool is its default
    named = chat(stack.url, f"{MODEL}@team-a", keys["team-a"])
    other = chat(stack.url, MODEL, keys["team-b"])
    assert [r.status_code for r in (own, named, other)] == [200, 200, 200]
    assert [r.headers["x-pool"] for r in (own, named, other)] == ["team-a", "team-a", "default"]
    team_a_worker = own.headers["x-worker-id"]
    assert named.headers["x-worker-id"] == team_a_worker != other.headers["x-worker-id"]

    listed = {m["id"] for m in httpx.get(f"{stack.url}/v1/models", headers=auth(keys["team-b"]), timeout=30).json()["data"]}
    assert f"{MODEL}@burst" in listed and f"{MODEL}@team-a" not in listed
    assert set(pools(stack.url, keys["team-b"])) == {"default", "burst"}


def test_usage_is_recorded_per_pool(pool_stack):
    stack, keys = pool_stack
    served = [chat(stack.url, MODEL, keys["team-a"], max_tokens=3) for _ in range(3)]
    assert all(r.status_code == 200 for r in served)
    reported = sum(r.json()["usage"]["completion_tokens"] for r in served)

    def team_a_usage():
        rows = httpx.get(f"{stack.url}/v1/usage", params={"group_by": "pool"}, headers=auth(keys["team-a"]),
                         timeout=30).json()["data"]
        return {row["pool"]: row for row in rows}

    by_pool = wait_for(lambda: (u := team_a_usage()).get("team-a", {}).get("requests", 0) >= 3 and u, 30,
                       "team-a's requests in the usage table")
    assert set(by_pool) == {"team-a"}   # every request of team-a ran on its reserved pool
    assert by_pool["team-a"]["completion_tokens"] >= reported


def usage_of(url: str, key: str) -> dict:
    rows = httpx.get(f"{url}/v1/usage", headers=auth(key), timeout=30).json()["data"]
    return {field: sum(row[field] for row in rows) for field in
            ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")}


def test_usage_totals_equal_the_sum_of_what_the_responses_reported(pool_stack):
    stack, keys = pool_stack
    question = "a long question about the build, " * 10   # over two KV blocks: turns 2-4 hit the prefix cache
    served = [chat(stack.url, MODEL, keys["metered"], max_tokens=n, session="metered", content=question)
              for n in (3, 5, 8, 2)]
    assert all(r.status_code == 200 for r in served)
    reported = {"requests": len(served),
                "prompt_tokens": sum(r.json()["usage"]["prompt_tokens"] for r in served),
                "cached_tokens": sum(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in served),
                "completion_tokens": sum(r.json()["usage"]["completion_tokens"] for r in served)}
    assert reported["cached_tokens"] > 0, "the session's repeated prompt should hit the prefix cache"
    recorded = wait_for(lambda: (u := usage_of(stack.url, keys["metered"]))["requests"] >= 4 and u, 30,
                        "the metered key's requests in the usage table")
    assert recorded == reported


def test_a_key_over_its_rate_limit_gets_429_with_retry_after(pool_stack):
    stack, keys = pool_stack
    answers = [chat(stack.url, MODEL, keys["limited"]) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert 0 < int(refused.headers["retry-after"]) <= 60
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    recorded = wait_for(lambda: (u := usage_of(stack.url, keys["limited"]))["requests"] >= 3 and u, 30, "usage")
    assert recorded["requests"] == 3, "a refused request must not count as served"


def test_a_serverless_pool_scales_from_zero_on_demand_and_back_to_zero_when_idle(pool_stack):
    stack, keys = pool_stack
    assert pools(stack.url, keys["team-b"])["burst"]["workers"] == 0

    started = time.monotonic()
    first = chat(stack.url, f"{MODEL}@burst", keys["team-b"])
    cold_start_s = time.monotonic() - started
    assert first.status_code == 200, first.text
    assert first.headers["x-pool"] == "burst"
    burst = pools(stack.url, keys["team-b"])["burst"]
    assert (burst["workers"], burst["ready_workers"], burst["cold_starts"]) == (1, 1, 1)
    assert cold_start_s > 2, "a worker cannot start that fast: the pool was not at zero"

    warm = chat(stack.url, f"{MODEL}@burst", keys["team-b"])
    assert warm.status_code == 200 and warm.headers["x-worker-id"] == first.headers["x-worker-id"]

    wait_for(lambda: pools(stack.url, keys["team-b"])["burst"]["workers"] == 0, 90, "burst back at zero workers")
    metrics = httpx.get(f"{stack.url}/metrics", timeout=30).text
    assert 'rollout_pool_workers{pool="burst",state="started"} 0.0' in metrics
    assert 'rollout_pool_cold_starts{pool="burst"} 1.0' in metrics


def test_the_pools_command_lists_size_load_and_owner(pool_stack):
    stack, keys = pool_stack
    listing = subprocess.run([sys.executable, "-m", "rollout_server.cli", "pools", "--url", stack.url,
                              "--api-key", keys["team-a"]], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert rows["team-a"][1:3] == ["reserved", "team-a"]
    assert rows["burst"][1:2] == ["serverless"] and rows["burst"][5] == "0-1"
    assert rows["default"][1] == "shared"
