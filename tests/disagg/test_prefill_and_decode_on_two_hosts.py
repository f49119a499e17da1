"""Prefill on one host, decode on another (cluster mode, docs/cluster.md): the front door's host (etcd, the front
door, Dynamo's frontend with its prefill router) and two worker hosts, network namespaces on one bridge
(tests/cluster/netns.py). The prefill worker's KV crosses the bridge to the decode worker over NIXL, UCX on TCP
only (`--ucx-transports tcp`: no shared memory between the namespaces), and the greedy tokens are those of
aggregated serving on one host (the disagg phase's `aggregated_reference`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from engine.supervisor.health import vllm_counter
from rollout_server.harness.cluster import ControlPlane
from rollout_server.harness.stack import RunningStack, start_stack
from tests.cluster.cluster_hosts import ClusterPorts, WorkerProcess, start_worker
from tests.cluster.netns import Hosts, assert_no_process_left, hosts_on_a_bridge, inside
from tests.disagg.conftest import GREEDY_PROMPTS, nixl_totals, reference_tokens

pytestmark = [
    pytest.mark.disagg, pytest.mark.stack, pytest.mark.timeout(1500),
    pytest.mark.skipif(os.geteuid() != 0, reason="hosts are network namespaces, which only root can make"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's `ip` to make network namespaces"),
]

KV_OVER_TCP = ["--ucx-transports", "tcp"]


@dataclass
class PrefillDecodeCluster:
    front_door: RunningStack
    prefill: WorkerProcess
    decode: WorkerProcess
    ports: ClusterPorts


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_on_a_bridge(tag=f"pd{os.getpid()}", worker_hosts=2, subnet="10.203.8") as made:
        yield made
    assert not any(os.path.exists(f"/run/netns/{ns}") for ns in made.namespaces)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory) -> Iterator[PrefillDecodeCluster]:
    tmp = tmp_path_factory.mktemp("pd-hosts")
    front, (prefill_host, decode_host) = hosts.front_door, hosts.workers
    with inside(front):
        control_plane = ControlPlane.running(host=front.address)
        plane = control_plane.__enter__()
    started: list = []
    try:
        with inside(front):
            ports = ClusterPorts.free()
            # Disaggregated (both counts > 0: the cluster's workers are prefill and decode workers); every prompt
            # is prefilled remotely, none kept on the decode worker (conditional disaggregation off)
            front_door = start_stack(tmp / "front-door", ready_path="/v1/models", extra_args=[
                "--cluster", "--etcd-endpoints", plane.etcd_url, "--internal-host", front.address,
                "--event-broker-port", str(ports.event_broker), "--prefill-workers", "1", "--decode-workers", "1",
                "--disagg-local-max-uncached-tokens", "0"], extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false"})
            started.append(front_door)
        for host, role in ((prefill_host, "prefill"), (decode_host, "decode")):
            with inside(host):
                started.append(start_worker(tmp / role, plane.etcd_url, front.address, ports,
                                            internal_host=host.address, role=role, extra_args=KV_OVER_TCP))
        yield PrefillDecodeCluster(front_door, started[1], started[2], ports)
    finally:
        for process in reversed(started):
            process.stop()
        control_plane.__exit__(None, None, None)
    assert_no_process_left(hosts)


def prompt_tokens(port: int) -> dict[str, float]:
    """vLLM's prompt-token accounting of one worker (on its own host's loopback)."""
    return {source: vllm_counter(port, "vllm:prompt_tokens_by_source_total", source=source)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}


def peers(host) -> list[str]:
    """host's established TCP connections' peer addresses (ip:port)."""
    with inside(host):
        lines = subprocess.run(["ss", "-tnH", "state", "established"], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    return [line.split()[-1] for line in lines if line.split()]


def test_prefill_on_one_host_and_decode_on_another_return_the_aggregated_tokens(hosts, cluster, aggregated_reference):
    prefill_host, decode_host = hosts.workers
    with inside(prefill_host):
        prefilled_before = prompt_tokens(cluster.prefill.system_port)
    with inside(decode_host):
        decoded_before = prompt_tokens(cluster.decode.system_port)
        transfers_before = nixl_totals([cluster.decode.system_port])

    with inside(hosts.front_door):
        tokens = reference_tokens(cluster.front_door.url)
    assert tokens == aggregated_reference

    with inside(decode_host):
        deadline = time.monotonic() + 30  # NIXL's telemetry reaches /metrics with the engine's next stats update
        while ((transfers := nixl_totals([cluster.decode.system_port]))["transfers"] == transfers_before["transfers"]
               and time.monotonic() < deadline):
            time.sleep(0.5)
        decoded = prompt_tokens(cluster.decode.system_port)
    with inside(prefill_host):
        prefilled = prompt_tokens(cluster.prefill.system_port)
    # The prefill host computed the prompts (the seeded sample's again from its prefix cache); the decode host
    # received them over NIXL instead of computing them (all but each prompt's last block at most)
    prompts, block = sum(len(p) for p in GREEDY_PROMPTS.values()), 32
    computed = {key: prefilled[key] - prefilled_before[key] for key in prefilled}
    received = {key: decoded[key] - decoded_before[key] for key in decoded}
    print(f"prompt tokens on the prefill host {computed}, on the decode host {received}")
    assert computed["local_compute"] >= prompts - len(GREEDY_PROMPTS) * block, computed
    assert received["external_kv_transfer"] >= prompts - len(GREEDY_PROMPTS) * block, received
    assert received["local_compute"] <= (len(GREEDY_PROMPTS) + 1) * block, received
    moved = {key: transfers[key] - transfers_before[key] for key in transfers}
    assert moved["transfers"] >= 1 and moved["bytes"] > 0, moved
    # ... across the bridge: the decode host holds UCX's TCP connection to the prefill host's address
    to_prefill_host = [peer for peer in peers(decode_host) if peer.startswith(f"{prefill_host.address}:")]
    print(f"NIXL moved {moved['bytes'] / 2**20:.1f} MiB in {moved['transfers']:.0f} transfer(s); the decode host's "
          f"connections to the prefill host: {to_prefill_host}")
    assert any(peer != f"{prefill_host.address}:{cluster.ports.nixl_side_channel}" for peer in to_prefill_host), \
        to_prefill_host
