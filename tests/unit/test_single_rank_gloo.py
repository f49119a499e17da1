"""engine/worker/single_rank_gloo.py: a process's single-rank gloo groups share one transport device, so one loop
thread wakes every 10 ms instead of one per group, and collectives on every group still work. Each case
runs in a fresh interpreter: torch.distributed's state belongs to the process."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, tempfile
import torch, torch.distributed as dist
from engine.worker.single_rank_gloo import share_one_device_among_single_rank_groups
if sys.argv[1] == "shared":
    share_one_device_among_single_rank_groups()
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
groups = [dist.new_group([0], backend="gloo") for _ in range(12)]  # as many as vLLM makes
for group in groups:
    x = torch.arange(3.0)
    dist.all_reduce(x, group=group)
    assert x.tolist() == [0.0, 1.0, 2.0]
    objects = ["kept"]
    dist.broadcast_object_list(objects, src=0, group=group)
    assert objects == ["kept"]
    dist.barrier(group=group)
loops = sum(open(f"/proc/self/task/{t}/comm").read().strip() == "gloo_tcp_loop" for t in os.listdir("/proc/self/task"))
print(loops)
"""


def _gloo_loop_threads(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_single_rank_groups_share_one_loop_and_their_collectives_work():
    assert _gloo_loop_threads("as_torch_makes_them") == 13  # the world group and 12 more: a device each
    assert _gloo_loop_threads("shared") == 1
