"""Cluster mode on one host: `rollout-serve up --cluster` starts no worker; a `rollout-serve worker` joins it
through a real etcd (rollout_server/harness/cluster.py); requests are served, and the worker's KV events reach
the front door's broker, where a KV router learns what the worker caches."""

import subprocess
import time

import httpx
import pytest
import yaml

from rollout_server.harness.cluster import ControlPlane
from rollout_server.harness.stack import REPO, start_stack
from rollout_server.harness.stack import routed_overlaps as logged_overlaps
from tests.cluster.cluster_hosts import MODEL, ClusterPorts, start_worker

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def control_plane():
    with ControlPlane.running() as plane:
        yield plane


@pytest.fixture(scope="module")
def cluster(control_plane, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    ports = ClusterPorts.free()
    front_door = start_stack(tmp / "front-door", extra_args=[
        "--cluster", "--etcd-endpoints", control_plane.etcd_url, "--event-broker-port", str(ports.event_broker)],
        ready_path="/v1/models")  # its /health says 503 until a worker has joined
    worker = None
    try:
        worker = start_worker(tmp / "worker", control_plane.etcd_url, "127.0.0.1", ports)
        yield front_door, worker
    finally:
        if worker is not None:
            worker.stop()
        front_door.stop()


def complete(url: str, prompt, max_tokens: int = 8, session: str | None = None) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    headers = {"X-Session-ID": session} if session else {}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)


def test_front_door_serves_through_a_worker_that_joined_by_etcd(cluster):
    front_door, worker = cluster
    reply = complete(front_door.url, "the worker joined through etcd")
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 8
    assert front_door.process.poll() is None and worker.process.poll() is None


def test_health_and_status_count_the_worker_that_joined(cluster):
    """The front door starts no worker; its /health is ready once a worker that joined through etcd serves, and
    /v1/status lists that worker (its Dynamo instance and the address it serves at)."""
    front_door, worker = cluster
    deadline = time.monotonic() + 30  # the pools' health check runs every few seconds
    while (health := httpx.get(f"{front_door.url}/health", timeout=10)).status_code != 200 and time.monotonic() < deadline:
        time.sleep(1)
    assert health.status_code == 200 and health.json()["healthy_workers"] == 1, health.text
    joined, = httpx.get(f"{front_door.url}/v1/status", timeout=10).json()["workers"]
    assert joined["role"] == "joined" and joined["healthy"] and joined["instance_id"], joined
    assert joined["address"].startswith("127.0.0.1:"), joined
    assert f"joined-{joined['instance_id']}" == joined["worker"]
    # The pools' own check (every second, and a request through Dynamo's frontend before a deployment rejoins)
    while (ready := httpx.get(f"{front_door.url}/v1/pools", timeout=10).json()["data"][0]["ready_workers"]) != 1 \
            and time.monotonic() < deadline + 30:
        time.sleep(1)
    assert ready == 1


def test_the_probes_the_manifests_give_kubernetes_answer_in_the_workers_host(cluster):
    """deploy/k8s/workers.yaml's probes, run as the kubelet runs them (in the worker's host, the worker's settings:
    here its port base), pass while the worker serves, and fail for a worker that is not there."""
    _, worker = cluster
    probes = yaml.safe_load((REPO / "deploy/k8s/workers.yaml").read_text())["spec"]["services"]["prefill"][
        "extraPodSpec"]["mainContainer"]
    port_base = ["--worker-system-base-port", str(worker.system_port)]
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = [str(REPO / ".venv/bin" / probes[name]["exec"]["command"][0]), *probes[name]["exec"]["command"][1:]]
        passed = subprocess.run([*command, *port_base], capture_output=True, text=True, timeout=60)
        assert passed.returncode == 0 and "ready" in passed.stdout, (name, passed.stdout, passed.stderr)
        absent = subprocess.run([*command, *port_base, "--index", "7"], capture_output=True, text=True, timeout=60)
        assert absent.returncode == 1 and "no answer" in absent.stdout, (name, absent.stdout, absent.stderr)


def test_cached_tokens_grow_across_a_sessions_turns_and_the_router_knows_them(cluster):
    front_door, _ = cluster
    cached = session_turns(front_door.url, "cluster-session")
    assert cached[0] == 0 and 0 < cached[1] < cached[2], cached
    # The front door's KV router logs, per request, how many of its blocks it knows the chosen worker to hold:
    # it knows them only from the worker's KV events, through the front door's broker.
    assert routed_overlaps(front_door.log_path, at_least=4)[-2:] == [c // BLOCK for c in cached[1:]], cached


BLOCK = 32  # engine.block_size


def session_turns(url: str, session: str, turns: int = 3) -> list[int]:
    """A session of `turns` turns, each prompt the last one + its answer + new tokens; each turn's cached tokens."""
    prompt, cached = list(range(100, 170)), []
    for turn in range(turns):
        reply = complete(url, prompt, 16, session)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        cached.append((body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        prompt = prompt + body["choices"][0]["token_ids"] + list(range(300 + 40 * turn, 340 + 40 * turn))
    return cached


def routed_overlaps(log_path, at_least: int = 3, wait_s: float = 10.0) -> list[int]:
    """The harness's routed_overlaps of the front door's log, waited for until `at_least` are there."""
    deadline = time.monotonic() + wait_s
    while len(overlaps := logged_overlaps(log_path)) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return overlaps
