import os
import signal
import subprocess
import sys
from pathlib import Path

from trace_pipeline.capture import TraceCapture
from trace_pipeline.settings import TraceSettings

CHILD = Path(__file__).parent / "child_writer.py"
ACKS_BEFORE_KILL = 1500


def test_kill_9_during_heavy_writing_loses_no_acknowledged_record(tmp_path):
    store_dir = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    child = subprocess.Popen([sys.executable, str(CHILD), str(store_dir)], stdout=subprocess.PIPE,
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

    capture = TraceCapture(TraceSettings(dir=store_dir))
    capture.start()   # recovery
    capture.close()
    stored = capture.store.read_table("team-a", columns=["request_id"])["request_id"].to_pylist()
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    assert len(stored) == len(set(stored)), "recovery duplicated records"
    assert capture.stats["recovered"] > 0, "the kill should have left unsealed WAL records"
