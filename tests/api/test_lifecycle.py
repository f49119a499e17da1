"""A stack of its own: a worker that dies gives a clean 503; SIGTERM leaves no process behind."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from engine.supervisor.compute_dtype import cpu_has_native_bf16
from engine.worker import engine_core_placement
from rollout_server.harness.stack import REPO, start_stack

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits to be reaped.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except ProcessLookupError:  # a thread that has just ended
        return None


def _check_cpu_placement(stack, worker_group: int) -> None:
    """engine/supervisor/cpu_placement.py: the model runs inside vLLM's engine core, pinned to the worker's core (0);
    the front door, Dynamo's processes and the engine's gloo threads run on the other cores, every thread
    of them as batch work."""
    engine = [pid for pid in stack.child_pids() if os.getpgid(pid) == worker_group and _comm(pid).startswith("VLLM::")]
    assert [_comm(pid) for pid in engine] == ["VLLM::EngineCor"], "one engine process, no separate model runner"
    others = set(range(1, os.cpu_count() or 1)) or {0}
    threads = {int(tid): _comm(int(tid)) for tid in os.listdir(f"/proc/{engine[0]}/task")}
    gloo = [tid for tid, name in threads.items() if name in engine_core_placement.GLOO_THREADS]
    assert gloo, threads
    for tid, name in threads.items():
        assert os.sched_getaffinity(tid) == (others if tid in gloo else {0}), (tid, name)
    for pid in [stack.process.pid] + [pid for pid in stack.child_pids() if pid != engine[0]]:
        assert os.sched_getaffinity(pid) == others, (pid, _comm(pid))
        policies = {tid: _policy(tid) for tid in map(int, os.listdir(f"/proc/{pid}/task"))}
        assert set(policies.values()) - {None} == {os.SCHED_BATCH}, (pid, _comm(pid), policies)


def _check_compute_dtype(stack) -> None:
    """engine/supervisor/compute_dtype.py: the tiny float32 checkpoint runs in float32 where this CPU would emulate bfloat16
    (vLLM's own choice elsewhere), as the engine's configuration line in the worker's log says."""
    worker_log = next(stack.state_dir.glob("stack-*/worker-0.log")).read_text()
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert f"dtype=torch.{expected}," in worker_log, worker_log[-2000:]


def _check_warm_up(stack) -> None:
    """engine/worker/dynamo_worker.py: the engine ran its own warm-up requests before the worker registered its
    model, so the first user request does not pay the engine's one-time costs."""
    worker_log = next(stack.state_dir.glob("stack-*/worker-0.log")).read_text()
    warmed, registered = worker_log.find("engine warmed up in"), worker_log.find("Registered base model")
    assert 0 <= warmed < registered, worker_log[-2000:]


def test_dead_worker_gives_503_then_sigterm_stops_everything(tmp_path):
    # Without restarts: the supervisor would start the worker again (tests/pools/test_failover.py), racing the
    # health check below.
    stack = start_stack(tmp_path, workers=1, extra_env={"ROLLOUT_SERVE_RESTART_DEAD_WORKERS": "false"})
    try:
        ok = httpx.post(f"{stack.url}/v1/chat/completions", timeout=60,
                        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert ok.status_code == 200

        status = subprocess.run([sys.executable, "-m", "rollout_server.cli", "status", "--url", stack.url],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and "True" in status.stdout, status.stdout + status.stderr

        processes = stack.child_pids()
        assert len(processes) >= 3  # frontend, worker, vLLM engine core
        worker_pid = stack.status()["workers"][0]["pid"]
        _check_cpu_placement(stack, worker_pid)
        _check_compute_dtype(stack)
        _check_warm_up(stack)
        os.killpg(worker_pid, signal.SIGKILL)

        started = time.monotonic()
        dead = httpx.post(f"{stack.url}/v1/chat/completions", timeout=120,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert time.monotonic() - started < 60, "a dead worker must not hang the request"
        assert dead.status_code == 503, dead.text
        assert dead.json()["error"]["code"] == "service_unavailable"
        health = httpx.get(f"{stack.url}/health", timeout=30)
        assert health.status_code == 503 and health.json()["healthy_workers"] == 0
    finally:
        code = stack.stop(signal.SIGTERM)
    assert code == 0, stack.log_tail()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in processes):
        time.sleep(0.5)
    assert not [p for p in processes if _alive(p)], "orphaned processes after SIGTERM"
