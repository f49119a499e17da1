"""Starts a real `rollout-serve up` (front door + Dynamo frontend + vLLM workers), for tests and benchmarks.

Each stack gets free ports and its own state directory; the tiny model is shared through the cache directory
so it is built once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.supervisor.ports import ephemeral_range, is_free

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("ROLLOUT_SERVE_TEST_CACHE", REPO / ".cache" / "rollout-serve"))
# Set by the tests (tests/conftest.py) for each test: "fast" for one without the `stack` or `disagg` marker,
# which must start no stack.
TEST_TIER_ENV = "ROLLOUT_SERVE_TEST_TIER"


def free_port_block(size: int, start: int | None = None) -> int:
    """The first port p >= start such that p .. p+size-1 are all free, below the kernel's ephemeral range
    (a port in it can be taken by any connection between this check and the child's bind: engine/supervisor/ports.py).
    The default start differs by process (30000 to 30975), so that test runs side by side rarely pick the same
    ports between one's check and its stack's bind."""
    port = start if start is not None else 30000 + 25 * (os.getpid() % 40)
    while port + size <= ephemeral_range().start:
        if all(is_free(port + i) for i in range(size)):
            return port
        port += size + 7
    raise RuntimeError(f"no {size} free ports from {start} below the ephemeral range")


def stop_process(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
    """Sends `sig` (if it still runs), waits `timeout` s for it to exit, else kills it; its exit code."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@dataclass
class RunningStack:
    url: str
    process: subprocess.Popen
    state_dir: Path
    log_path: Path
    model: str = "tiny-qwen2"

    @property
    def frontend_url(self) -> str:
        """Dynamo's frontend behind the front door (start_stack puts it on the front door's port + 1)."""
        host, port = self.url.rsplit(":", 1)
        return f"{host}:{int(port) + 1}"

    def worker_system_port(self, worker: int = 0) -> int:
        """Worker i's Dynamo system port, which also serves vLLM's metrics (start_stack: front door's port + 2 + i)."""
        return int(self.url.rsplit(":", 1)[1]) + 2 + worker

    def status(self) -> dict:
        return httpx.get(f"{self.url}/v1/status", timeout=10).json()

    def child_pids(self) -> list[int]:
        """Every process in the stack's process tree (for orphan checks)."""
        out = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid="], capture_output=True, text=True).stdout
        rows = [tuple(map(int, line.split())) for line in out.splitlines() if line.strip()]
        tree, frontier = set(), {self.process.pid}
        while frontier:
            tree |= frontier
            frontier = {pid for pid, ppid, _ in rows if ppid in frontier} - tree
        groups = {pgid for pid, _, pgid in rows if pid in tree}
        return sorted({pid for pid, _, pgid in rows if pgid in groups} | tree - {self.process.pid})

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        return stop_process(self.process, sig, timeout)

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log_path, n)

    def diagnostics(self, width: int = 240) -> str:
        """What CI shows for a failed test on this stack: the front door's warnings and errors and the end
        of each engine process's log."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        notable = [line for line in lines if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        parts = [f"== {self.log_path} (warnings and errors, last 30)", *notable[-30:],
                 f"== {self.log_path} (last 10 lines)", *lines[-10:]]
        for log in sorted(self.state_dir.glob("stack-*/*.log")):
            parts += [f"== {log}", *_tail(log, 8).splitlines()]
        return "\n".join(_ANSI_COLOUR.sub("", line)[:width] for line in parts)


def start_stack(tmp_dir: Path, workers: int = 1, extra_args: list[str] | None = None,
                extra_env: dict[str, str] | None = None, timeout_s: float = 420.0,
                open_mode: bool = True, ready_path: str = "/health") -> RunningStack:
    """A running `rollout-serve up`; `open_mode`: requests from this machine need no key (--open-mode), as most
    tests and benchmarks send none; a key sent is still that key's team. `ready_path`: what answers 200 once it
    is up (a cluster's front door with no worker yet answers /health with 503: wait for /v1/models)."""
    if os.environ.get(TEST_TIER_ENV) == "fast":
        raise RuntimeError("a test without the `stack` marker started a stack: mark it `stack`")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    base = free_port_block(4 + 2 * workers)
    port, frontend_port = base, base + 1
    args = [
        sys.executable, "-m", "rollout_server.cli", "up",
        "--workers", str(workers), "--port", str(port), "--frontend-port", str(frontend_port),
        "--worker-system-base-port", str(base + 2), "--kv-events-base-port", str(base + 2 + workers),
        "--cache-dir", str(CACHE_DIR), "--state-dir", str(tmp_dir / "state"),
        # Tests and benchmarks write the checkpoints they deploy beside the stack's directory (pytest's base temp
        # dir holds tmp_path and every mktemp), so that directory is a deploy root of the stacks started here.
        "--deploy-checkpoint-roots", str(tmp_dir.resolve().parent),
        "--kv-cache-gib", "0.5", "--open-mode" if open_mode else "--no-open-mode",
    ] + (extra_args or [])
    log_path = tmp_dir / "rollout-serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    env.pop("TRITON_INTERPRET", None)  # the kernel tests' interpreter mode is not for the served engine
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    stack = RunningStack(f"http://127.0.0.1:{port}", process, tmp_dir / "state", log_path)
    try:
        wait_until_answering(f"{stack.url}{ready_path}", process, log_path, timeout_s)
    except RuntimeError:
        stack.stop(signal.SIGKILL)
        raise
    return stack


def create_key(database_url: str, team: str) -> str:
    """A new API key for `team`, made with `rollout-serve keys create` as an operator would."""
    done = subprocess.run([sys.executable, "-m", "rollout_server.cli", "keys", "create", "--team", team,
                           "--database-url", database_url], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_until_answering(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Polls `url` until it answers 200; fails early, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[2:4]} exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s:\n{_tail(log_path)}")


_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Dynamo colours its log lines


def routed_overlaps(log_path: Path) -> list[int]:
    """The overlap (in blocks) Dynamo's KV router knew for every request it placed, in order: its "route request
    completed" log line, written as a request's stream ends, in the log of the process that routed it."""
    text = _ANSI_COLOUR.sub("", log_path.read_text(errors="replace"))
    return [int(n) for n in re.findall(r"route request completed.*? overlap_blocks=(\d+)", text)]


def _tail(log_path: Path, lines: int = 40) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
