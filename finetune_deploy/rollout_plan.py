"""The rollout plan: which worker does what, in which order, to move a pool to a new version.

A pure function; an executor runs the steps against real workers. Each worker
goes through pause -> update_weights -> reset_kv -> resume. The KV cache is
reset on every tier because blocks computed with the old weights are wrong
for the new ones, wherever they were offloaded.

- rolling: one worker at a time, so at least N-1 keep serving (needs N >= 2).
  For a while some workers run the new version and some the old one.
- all_at_once: every worker pauses before any loads, and none resumes before
  all are updated: no rollout ever mixes two policies (a synchronous RL step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["rolling", "all_at_once"]
MODES = ("rolling", "all_at_once")
KV_TIERS = ("device", "host", "disk")  # GPU blocks, CPU offload, disk offload
WORKER_SEQUENCE = ("pause", "update_weights", "reset_kv", "resume")


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class Step:
    worker: str
    action: str                     # one of WORKER_SEQUENCE
    version: int | None = None      # update_weights only
    path: str | None = None         # update_weights only
    kind: str | None = None         # update_weights only: "full" | "lora"
    tiers: tuple[str, ...] = ()     # reset_kv only


def plan_rollout(workers: list[str], mode: Mode, version: int, path: str, kind: str = "full",
                 kv_tiers: tuple[str, ...] = KV_TIERS) -> list[Step]:
    _check_request(workers, mode, kind, kv_tiers)
    per_worker = {worker: _worker_steps(worker, version, path, kind, tuple(kv_tiers)) for worker in workers}
    if mode == "rolling":
        steps = [step for worker in workers for step in per_worker[worker]]
    else:
        # Phase by phase: all pauses, then all updates, all resets, all resumes.
        steps = [per_worker[worker][phase] for phase in range(len(WORKER_SEQUENCE)) for worker in workers]
    check_plan(steps, workers, mode)
    return steps


def _worker_steps(worker: str, version: int, path: str, kind: str, tiers: tuple[str, ...]) -> list[Step]:
    return [Step(worker, "pause"),
            Step(worker, "update_weights", version=version, path=path, kind=kind),
            Step(worker, "reset_kv", tiers=tiers),
            Step(worker, "resume")]


def _check_request(workers: list[str], mode: str, kind: str, kv_tiers: tuple[str, ...]) -> None:
    if mode not in MODES:
        raise PlanError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not workers:
        raise PlanError("the pool has no workers")
    if len(set(workers)) != len(workers):
        raise PlanError("worker ids must be unique")
    if mode == "rolling" and len(workers) < 2:
        raise PlanError("rolling mode keeps N-1 workers serving, so it needs at least 2; use all_at_once")
    if kind not in ("full", "lora"):
        raise PlanError(f"kind must be full or lora, got {kind!r}")
    unknown = [tier for tier in kv_tiers if tier not in KV_TIERS]
    if not kv_tiers or unknown:
        raise PlanError(f"kv tiers must be a non-empty subset of {', '.join(KV_TIERS)}, got {list(kv_tiers)}")


def check_plan(steps: list[Step], workers: list[str], mode: Mode) -> None:
    """Raises PlanError unless every worker runs its sequence once, in order, and the mode's invariant holds."""
    progress = {worker: 0 for worker in workers}  # index of each worker's next action in WORKER_SEQUENCE
    paused: set[str] = set()
    for position, step in enumerate(steps):
        if step.worker not in progress:
            raise PlanError(f"step {position} is for unknown worker {step.worker!r}")
        done = progress[step.worker]
        if done == len(WORKER_SEQUENCE) or step.action != WORKER_SEQUENCE[done]:
            expected = WORKER_SEQUENCE[done] if done < len(WORKER_SEQUENCE) else "nothing more"
            raise PlanError(f"step {position}: worker {step.worker} does {step.action}, expected {expected}")
        progress[step.worker] += 1
        if step.action == "pause":
            paused.add(step.worker)
        if step.action == "resume":
            paused.discard(step.worker)
        _check_mode_invariant(mode, position, step, paused, progress, workers)
    unfinished = [worker for worker, done in progress.items() if done != len(WORKER_SEQUENCE)]
    if unfinished:
        raise PlanError(f"workers {', '.join(unfinished)} do not finish pause, update_weights, reset_kv, resume")


def _check_mode_invariant(mode: str, position: int, step: Step, paused: set[str], progress: dict[str, int],
                          workers: list[str]) -> None:
    if mode == "rolling" and len(paused) > 1:
        raise PlanError(f"step {position}: {len(paused)} workers paused at once in rolling mode "
                        f"({', '.join(sorted(paused))}); at most one may be")
    if mode == "rolling" and len(paused) == len(workers):
        raise PlanError(f"step {position}: every worker is paused in rolling mode")
    if mode == "all_at_once" and step.action == "update_weights" and len(paused) != len(workers):
        raise PlanError(f"step {position}: worker {step.worker} loads new weights while others still serve")
    if mode == "all_at_once" and step.action == "resume":
        reset = WORKER_SEQUENCE.index("reset_kv") + 1
        lagging = [worker for worker in workers if progress[worker] < reset]
        if lagging:
            raise PlanError(f"step {position}: worker {step.worker} resumes before {', '.join(lagging)} "
                            "is updated")
