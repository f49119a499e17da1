import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sealed_in

from trace_pipeline.capture import TraceCapture
from trace_pipeline.settings import TraceSettings

CHILD = Path(__file__).parent / "child_writer.py"
ACKS_BEFORE_KILL = 1500


@pytest.mark.parametrize("where", ["local", "s3"])
def test_kill_9_during_heavy_writing_loses_no_acknowledged_record(tmp_path, request, where):
    """Sealing to S3 too: the WAL is local, and what the kill left in it is sealed to S3 on restart."""
    store_dir = tmp_path / "store"
    sealed = sealed_in(where, request)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    argv = [sys.executable, str(CHILD), str(store_dir)]
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        env.update(server.environment())
        argv += [sealed["sealed_uri"], server.endpoint_url]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    acked = []
    try:
        assert child.stdout.readline().strip() == "ready"
        while len(acked) < ACKS_BEFORE_KILL:
            line = child.stdout.readline()
            assert line, "child exited early"
            acked.append(line.split()[1])
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    acked += [line.split()[1] for line in child.stdout.read().splitlines()]   # acks still in the pipe

    capture = TraceCapture(TraceSettings(dir=store_dir, **sealed))
    capture.start()   # recovery
    capture.close()
    stored = capture.store.read_table("team-a", columns=["request_id"])["request_id"].to_pylist()
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    assert len(stored) == len(set(stored)), "recovery duplicated records"
    assert capture.stats["recovered"] > 0, "the kill should have left unsealed WAL records"
