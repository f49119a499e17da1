"""Reserved and serverless pools on the real stack: a reserved pool serves only its team (403 for the
others), a serverless pool starts a real Dynamo vLLM worker when a request arrives at zero and stops
it when idle, and usage is recorded per pool."""

import subprocess
import sys
import time

import httpx
import pytest

from tests.pools.pool_stack import MODEL, auth, chat, pools, start_pool_stack, wait_for
from tests.stack_harness import REPO

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
                                   teams=("team-a", "team-b", "ops"),
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
