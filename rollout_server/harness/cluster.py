"""A throwaway control plane for cluster-mode tests: real etcd and NATS servers (Debian's `etcd-server` and
`nats-server` packages, which `scripts/bootstrap` installs), on one address of this machine.

    with ControlPlane.running() as plane:          # loopback by default
        plane.etcd_url                             # http://127.0.0.1:PORT: ETCD_ENDPOINTS, --etcd-endpoints
        plane.nats_url                             # nats://127.0.0.1:PORT: NATS_SERVER, --nats-url

Each server listens on `host` only (its client port and etcd's peer port), keeps its data in a temporary
directory, and is stopped and removed when the `running()` block ends. rollout-serve's cluster mode needs etcd
alone (Dynamo's discovery); NATS is started with it because Dynamo's other planes can use it and the cluster
tests check that it runs.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from rollout_server.harness.stack import free_port_block

START_TIMEOUT_S = 30.0


class ControlPlaneUnavailable(RuntimeError):
    """etcd or nats-server is not installed, or would not start (the message says which and why)."""


def _binary(name: str, package: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        raise ControlPlaneUnavailable(f"`{name}` is not installed: run scripts/bootstrap as root (it installs "
                                      f"Debian's {package} package), or `apt-get install {package}`")
    return path


@dataclass
class ControlPlane:
    host: str
    etcd_port: int
    nats_port: int
    root: Path
    processes: list[subprocess.Popen]

    @property
    def etcd_url(self) -> str:
        return f"http://{self.host}:{self.etcd_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://{self.host}:{self.nats_port}"

    @classmethod
    @contextlib.contextmanager
    def running(cls, host: str = "127.0.0.1", run_in: list[str] | None = None) -> Iterator[ControlPlane]:
        """Starts both servers on `host`; `run_in` prefixes their command lines (`ip netns exec NAME`: run
        them inside a network namespace that owns `host`)."""
        etcd, nats = _binary("etcd", "etcd-server"), _binary("nats-server", "nats-server")
        base = free_port_block(3, start=29000)  # etcd client, etcd peer, NATS client
        plane = cls(host, base, base + 2, Path(tempfile.mkdtemp(prefix="rollout-serve-cluster-")), [])
        try:
            plane._start(run_in or [], etcd, nats, peer_port=base + 1)
            yield plane
        finally:
            plane._stop()
            shutil.rmtree(plane.root, ignore_errors=True)

    def _start(self, run_in: list[str], etcd: str, nats: str, peer_port: int) -> None:
        peer_url = f"http://{self.host}:{peer_port}"
        self._launch(run_in + [
            etcd, "--name", "rollout-serve-test", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"rollout-serve-test={peer_url}",
        ], "etcd.log")
        self._launch(run_in + [nats, "--addr", self.host, "--port", str(self.nats_port),
                               "--http_port", "0", "--no_advertise"], "nats.log")
        self._wait_until(self._etcd_healthy, "etcd", "etcd.log")
        self._wait_until(self._nats_answers, "nats-server", "nats.log")

    def _launch(self, argv: list[str], log_name: str) -> None:
        with open(self.root / log_name, "wb") as log:
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))

    def _wait_until(self, ready, what: str, log_name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                break
            if ready():
                return
            time.sleep(0.1)
        log_tail = (self.root / log_name).read_text(errors="replace")[-3000:]
        raise ControlPlaneUnavailable(f"{what} did not start on {self.host}:\n{log_tail}")

    def _etcd_healthy(self) -> bool:
        try:
            return httpx.get(f"{self.etcd_url}/health", timeout=1.0).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def _nats_answers(self) -> bool:
        """A NATS server greets every client with an INFO line."""
        try:
            with socket.create_connection((self.host, self.nats_port), timeout=1.0) as conn:
                return conn.recv(5) == b"INFO "
        except OSError:
            return False

    def _stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
