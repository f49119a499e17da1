"""Cluster mode across hosts: the front door (with etcd and NATS) on one network namespace, `rollout-serve worker`s
on two others, joined by a bridge (tests/cluster/netns.py). A worker registers through etcd at the front door
host's address, serves on the request plane at its own, and its KV events cross to the front door's broker.
Killing the only worker host's processes leaves the front door answering with a clean error; with two worker
hosts, killing every process of the one that holds a session moves the session to the other; nothing is left
after."""

import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rollout_server.harness.cluster import ControlPlane
from rollout_server.harness.pool_stack import pools, wait_for
from rollout_server.harness.stack import start_stack
from tests.cluster.cluster_hosts import ClusterPorts, start_worker
from tests.cluster.netns import assert_no_process_left, hosts_on_a_bridge, inside, processes_in
from tests.cluster.test_cluster_one_host import BLOCK, complete, routed_overlaps, session_turns

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(os.geteuid() != 0, reason="hosts are network namespaces, which only root can make"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's `ip` to make network namespaces"),
]


@pytest.fixture(scope="module")
def hosts():
    with hosts_on_a_bridge(tag=str(os.getpid()), worker_hosts=2) as made:
        yield made
    assert not any(os.path.exists(f"/run/netns/{ns}") for ns in made.namespaces)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-hosts")
    front, worker_host = hosts.front_door, hosts.worker
    with inside(front):
        control_plane = ControlPlane.running(host=front.address)
        plane = control_plane.__enter__()
    front_door = worker = None
    more_workers = []  # what the failover test starts
    try:
        with inside(front):
            ports = ClusterPorts.free()
            front_door = start_stack(tmp / "front-door", ready_path="/v1/models", extra_args=[
                "--cluster", "--etcd-endpoints", plane.etcd_url, "--internal-host", front.address,
                "--event-broker-port", str(ports.event_broker)])
        with inside(worker_host):
            worker = start_worker(tmp / "worker", plane.etcd_url, front.address, ports, internal_host=worker_host.address)
        yield front_door, worker, plane, ports, tmp, more_workers
    finally:
        for started in [worker, *more_workers]:
            if started is not None:
                started.stop()
        if front_door is not None:
            front_door.stop()
        control_plane.__exit__(None, None, None)
    assert_no_process_left(hosts)


def test_a_worker_on_another_host_serves_and_its_kv_events_reach_the_front_door(hosts, cluster):
    front_door, *_ = cluster
    with inside(hosts.front_door):
        reply = complete(front_door.url, "a worker on another host")
        assert reply.status_code == 200, reply.text
        cached = session_turns(front_door.url, "two-hosts-session")
    assert cached[0] == 0 and 0 < cached[1] < cached[2], cached
    assert routed_overlaps(front_door.log_path, at_least=4)[-2:] == [c // BLOCK for c in cached[1:]], cached
    # The request plane crossed the bridge: the front door holds a connection to the worker host's address.
    with inside(hosts.front_door):
        sockets = subprocess.run(["ss", "-tn", "state", "established"], check=True, capture_output=True,
                                 text=True).stdout
    assert f"{hosts.worker.address}:" in sockets, sockets


def test_killing_the_worker_hosts_processes_gives_a_clean_error(hosts, cluster):
    front_door, worker, *_ = cluster
    os.killpg(worker.process.pid, signal.SIGKILL)  # the worker host fails: its command and what it started
    worker.process.wait(timeout=30)
    with inside(hosts.front_door):
        started = time.monotonic()
        reply = complete(front_door.url, "is anyone there")
        took = time.monotonic() - started
        assert front_door.process.poll() is None
    print(f"after the worker host died: {reply.status_code} in {took:.1f} s: {reply.text[:200]}")
    assert reply.status_code in (502, 503, 504), reply.text
    assert "error" in reply.json(), reply.text
    assert took < 60, took


def test_a_session_whose_worker_host_dies_goes_on_on_the_other_host(hosts, cluster):
    """A worker on each worker host (the first host's first worker died in the test above). The host that served
    a session's first turn freezes (every process stopped), the session's next turn is sent three times at once,
    and once the front door has the three in flight every process of that host is killed: none had a token, and
    each is served by the other host's worker (the router drops the dead one, the front door retries: no request
    is lost)."""
    front_door, _, plane, ports, tmp, more_workers = cluster
    placed = [(host, index) for host, index in ((hosts.workers[0], 1), (hosts.workers[1], 0))]
    for host, index in placed:
        with inside(host):
            more_workers.append(start_worker(tmp / host.namespace, plane.etcd_url, hosts.front_door.address, ports,
                                             internal_host=host.address, index=index))
    before = []
    for (host, _), worker in zip(placed, more_workers):  # each worker's own warm-up requests count too
        with inside(host):
            before.append(requests_served(worker.system_port))
    with inside(hosts.front_door):
        first = complete(front_door.url, list(range(500, 600)), 8, "failover-session")
    assert first.status_code == 200, first.text
    counts = []
    for (host, _), worker, served in zip(placed, more_workers, before):
        with inside(host):
            counts.append(requests_served(worker.system_port) - served)
    assert sorted(counts) == [0, 1], counts
    holder = counts.index(1)
    dead_host = placed[holder][0]
    doomed = processes_in(dead_host.namespace)  # the whole host: its workers and everything they started
    next_turn = list(range(500, 600)) + first.json()["choices"][0]["token_ids"]

    def send_next_turn() -> httpx.Response:
        with inside(hosts.front_door):
            return complete(front_door.url, next_turn, 8, "failover-session")

    signal_all(doomed, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(3) as threads:
            turns = [threads.submit(send_next_turn) for _ in range(3)]
            with inside(hosts.front_door):
                wait_for(lambda: pools(front_door.url)["default"]["in_flight"] == 3, 30, "the three turns in flight",
                         poll_s=0.05)
            started = time.monotonic()
            signal_all(doomed, signal.SIGKILL)
            answers = [turn.result(timeout=120) for turn in turns]
            took = time.monotonic() - started
    finally:
        signal_all(doomed, signal.SIGKILL)
    more_workers[holder].process.wait(timeout=30)
    print(f"the session's next turns, in flight when their worker host died: {[a.status_code for a in answers]} "
          f"within {took:.1f} s")
    assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]
    assert len({tuple(a.json()["choices"][0]["token_ids"]) for a in answers}) == 1  # greedy: the same tokens
    survivor_host, _ = placed[1 - holder]
    with inside(survivor_host):
        assert requests_served(more_workers[1 - holder].system_port) - before[1 - holder] == 3
    assert not processes_in(dead_host.namespace)


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def requests_served(system_port: int) -> int:
    """Requests a worker finished (vLLM's counter on its health port, on its host's loopback)."""
    from engine.supervisor.health import vllm_counter

    return int(vllm_counter(system_port, "vllm:request_success_total"))
