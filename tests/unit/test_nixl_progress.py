"""engine/worker/nixl_progress.py on a real NIXL agent: with the switch off, the agent starts no progress
thread and an idle agent uses no CPU (with NIXL's default, its progress thread spins)."""

import json
import subprocess
import sys

from rollout_server.harness.stack import REPO

PROBE = """
import json, os, sys, time
from engine.worker.nixl_progress import SWITCH, register
if sys.argv[1] == "off":
    os.environ[SWITCH] = "off"
register()
from nixl._api import nixl_agent, nixl_agent_config
threads_before = len(os.listdir("/proc/self/task"))
agent = nixl_agent("probe", nixl_agent_config(num_threads=1, capture_telemetry=True))  # as vLLM builds it
time.sleep(0.3)
threads = len(os.listdir("/proc/self/task")) - threads_before
cpu_start = time.process_time()
time.sleep(1.0)
print(json.dumps({"threads": threads, "idle_cpu_s": time.process_time() - cpu_start}))
"""


def idle_agent(switch: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, switch], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_agent_without_its_progress_thread_does_not_spin_while_idle():
    default, patched = idle_agent("on"), idle_agent("off")
    assert patched["threads"] == default["threads"] - 1
    assert patched["idle_cpu_s"] < 0.05
    assert default["idle_cpu_s"] > patched["idle_cpu_s"] + 0.1, "NIXL's progress thread no longer spins: drop the patch"
