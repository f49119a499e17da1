"""Failover on the real stack: a pool with two deployments (a Dynamo frontend and a vLLM worker each).

SIGKILL of a worker under concurrent load loses no request that had not started streaming (the front
door sends it to the other deployment) and ends the started streams on the dead worker with a clean,
retryable error event; killing a whole deployment moves its traffic to the other; a dead deployment is
out of rotation until it is restarted and healthy again."""

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rollout_server.harness.pool_stack import (
    IN_FLIGHT_S,
    MODEL,
    StreamRecord,
    completed,
    kill_worker_under_load,
    pools,
    start_pool_stack,
    stream,
    wait_for,
)

pytestmark = pytest.mark.stack

POOLS = """
[pools.ha]
kind = "shared"
deployments = 2
workers = 1
"""
HA = f"{MODEL}@ha"


@pytest.fixture(scope="module")
def ha_stack(tmp_path_factory):
    stack, _ = start_pool_stack(tmp_path_factory.mktemp("failover"), POOLS, deployments=2)
    yield stack
    stack.stop()


def deployment(stack, name: str) -> dict:
    return {d["name"]: d for d in pools(stack.url)["ha"]["deployments"]}[name]


def test_killing_a_worker_under_load_loses_no_request_that_had_not_started(ha_stack):
    wait_for(lambda: all(d["healthy"] for d in pools(ha_stack.url)["ha"]["deployments"]), 120, "both deployments up")
    # Streams on both deployments, then 12 new requests under sessions routed to ha/0, whose worker is then
    # killed. The figures count the requests that went to ha/0 alone (the harness tells them apart per request).
    outcome = kill_worker_under_load(ha_stack, HA, victim="ha/0", arriving=12)
    name, victim = outcome.victim, outcome.victim_pid
    assert outcome.not_started, "no request without a token was on the killed worker: failover was not exercised"
    assert not outcome.lost, f"requests on {name} that had not streamed a token were lost: {outcome.lost}"
    assert not outcome.failed_elsewhere, f"requests on the other deployment failed: {outcome.failed_elsewhere}"
    assert outcome.cut, "no stream was on the killed worker: the test did not exercise a kill"
    for record in outcome.cut:          # a clean, retryable end: an error event, then [DONE]
        assert record.error["code"] == "service_unavailable" and record.done, record
        # Its tokens stopped at the kill. (How many it had by then says nothing: on a cold stack one
        # deployment can warm up many seconds before the other, and the streams on it run on meanwhile.)
        assert record.last_token_at < outcome.killed_at + IN_FLIGHT_S, record
    # Each request on the victim that had no token yet was refused by it and served by the other deployment:
    # the front door counted it as moved (streams that had tokens are never sent again).
    assert outcome.failovers >= len(outcome.not_started), outcome.failovers

    wait_for(lambda: not deployment(ha_stack, name)["healthy"] or deployment(ha_stack, name)["worker_pids"][0]
             != victim, 30, f"{name} out of rotation or restarted")
    wait_for(lambda: deployment(ha_stack, name)["healthy"], 180, f"{name} restarted and back in rotation")
    assert deployment(ha_stack, name)["worker_pids"][0] != victim


def test_killing_a_whole_deployment_moves_its_traffic_to_the_other(ha_stack):
    wait_for(lambda: all(d["healthy"] for d in pools(ha_stack.url)["ha"]["deployments"]), 180, "both deployments up")
    victim = deployment(ha_stack, "ha/1")
    before = pools(ha_stack.url)["ha"]["failovers"]
    for pid in [victim["frontend_pid"], *victim["worker_pids"]]:
        os.killpg(pid, signal.SIGKILL)

    records = [StreamRecord() for _ in range(10)]
    with ThreadPoolExecutor(len(records)) as threads:
        for future in [threads.submit(stream, ha_stack.url, HA, f"after-{i}", 20, r) for i, r in enumerate(records)]:
            future.result(timeout=300)
    assert all(completed(r) for r in records), [vars(r) for r in records if not completed(r)]
    assert pools(ha_stack.url)["ha"]["failovers"] > before or not deployment(ha_stack, "ha/1")["healthy"]

    metrics = httpx.get(f"{ha_stack.url}/metrics", timeout=30).text
    assert 'rollout_deployment_healthy{deployment="ha/0",pool="ha"} 1.0' in metrics
    wait_for(lambda: deployment(ha_stack, "ha/1")["healthy"], 180, "ha/1 restarted and back in rotation")


def test_a_worker_whose_registration_expired_is_restarted_and_serves_again(ha_stack):
    """A machine that stalls longer than Dynamo's file-store TTL (30 s) has every registration in a discovery
    directory expire, and a worker does not register again by itself: it runs, answers its health check, and gets
    no request. Removing ha/0's registrations is that expiry; the supervisor restarts the worker it no longer
    finds, and ha/0 serves again."""
    wait_for(lambda: all(d["healthy"] for d in pools(ha_stack.url)["ha"]["deployments"]), 180, "both deployments up")
    before = deployment(ha_stack, "ha/0")
    port = before["url"].rsplit(":", 1)[1]
    registrations = [p for p in (ha_stack.state_dir / f"stack-{port}" / "discovery").rglob("*") if p.is_file()]
    assert registrations, "ha/0 registered nothing in its discovery directory"
    for path in registrations:
        path.unlink()

    wait_for(lambda: deployment(ha_stack, "ha/0")["worker_pids"][0] not in (None, before["worker_pids"][0]), 60,
             "ha/0's unlisted worker restarted")
    wait_for(lambda: deployment(ha_stack, "ha/0")["healthy"], 180, "ha/0 back in rotation")
    assert "gone from Dynamo's discovery" in ha_stack.log_path.read_text()
    # ha/0's own frontend places a request on its worker again (before the restart: "no endpoints available")
    body = {"model": MODEL, "prompt": "registered again", "max_tokens": 4}
    assert httpx.post(f"{before['url']}/v1/completions", json=body, timeout=120).status_code == 200
