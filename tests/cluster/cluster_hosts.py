"""What the cluster tests share: the ports of a cluster, and a `rollout-serve worker` process started as an
operator would start one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rollout_server.harness.stack import CACHE_DIR, REPO, free_port_block, stop_process, wait_until_answering

MODEL = "tiny-qwen2"


@dataclass
class ClusterPorts:
    """The ports a test's cluster uses besides the front door's own (rollout_server/harness/stack.py picks those)."""

    event_broker: int      # the front door's broker: publishers here, subscribers on the next port
    worker_system: int     # worker 0's health port; worker i's is this + i
    worker_kv_events: int  # worker 0's own KV-event relay; worker i's is this + i
    nixl_side_channel: int  # prefill/decode worker 0's NIXL handshake; worker i's is this + i

    @classmethod
    def free(cls) -> ClusterPorts:
        base = free_port_block(2 + 3 * WORKERS_PER_HOST, start=28000 + 12 * (os.getpid() % 40))
        return cls(base, base + 2, base + 2 + WORKERS_PER_HOST, base + 2 + 2 * WORKERS_PER_HOST)


WORKERS_PER_HOST = 3  # at most, in these tests


@dataclass
class WorkerProcess:
    process: subprocess.Popen
    log_path: Path
    system_port: int

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        return stop_process(self.process, sig, timeout)


def start_worker(tmp_dir: Path, etcd_url: str, front_door_host: str, ports: ClusterPorts,
                 internal_host: str = "127.0.0.1", index: int = 0, role: str = "aggregated",
                 extra_args: list[str] | None = None, timeout_s: float = 420.0) -> WorkerProcess:
    """`rollout-serve worker --role role --index index` joining the front door at `front_door_host`, ready (its
    health port says so)."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "rollout_server.cli", "worker", "--etcd-endpoints", etcd_url,
        "--front-door", front_door_host, "--internal-host", internal_host, "--index", str(index),
        "--event-broker-port", str(ports.event_broker), "--worker-system-base-port", str(ports.worker_system),
        "--kv-events-base-port", str(ports.worker_kv_events), "--kv-cache-gib", "0.5",
        "--nixl-side-channel-base-port", str(ports.nixl_side_channel), "--role", role,
        "--cache-dir", str(CACHE_DIR), "--state-dir", str(tmp_dir / "state"), *(extra_args or []),
    ]
    log_path = tmp_dir / f"{role}-worker-{index}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TRITON_INTERPRET", None)
    with open(log_path, "wb") as log:  # the worker writes to its own copy of the file
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    worker = WorkerProcess(process, log_path, ports.worker_system + index)
    try:
        wait_until_answering(f"http://127.0.0.1:{worker.system_port}/health", process, log_path, timeout_s)
    except RuntimeError:
        worker.stop(signal.SIGKILL)
        raise
    return worker
