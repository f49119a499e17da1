"""The deployer: moves a pool's workers to a registered version, live.

The registry says what (versions and their status), the rollout plan says in
which order, Dynamo's vLLM workers do the work (`engine/supervisor/worker_control.py`), and
the front door's model table learns which worker runs which version as it
happens, so every response is stamped with the version that produced it.

Full weights, per worker: pause (in-flight requests finish on the old weights,
are aborted with a retryable error, or are kept: frozen, then they go on under
the new weights, every token stamped with the version that sampled it:
`DeploySettings.in_flight`), reload the weights in place, reset every KV cache
tier, resume. Requests that arrive at a
paused worker wait in its queue; nothing is dropped. If a step fails, workers
already switched go back to the old weights and every paused worker resumes: the
pool keeps serving the old version, and the version is marked failed.

LoRA adapters load on every worker beside the weights and are served under their
own model id; a new version of an adapter replaces the old one in place.

Paths: a checkpoint registers only from under the deploy roots (DeploySettings.checkpoint_roots and the server's
own directories), symlinks resolved first; and a version loads on a worker (deploy, rollback, restore, put back,
a worker started later) only while its files are still the ones registered (registry.verify_unchanged, checked
right before each worker's load): one that changed is refused and the pool keeps what it served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Protocol, Sequence

from engine.ids import BASE_VERSION, PolicyVersion
from engine.supervisor.worker_control import PauseMode, WorkerControl, WorkerControlError, WorkerHandle
from engine.weight_stamps import RunningKv
from finetune_deploy.checkpoint_files import CheckpointChanged, resolve_under_roots
from finetune_deploy.registry import CheckpointRegistry, RegisteredVersion
from finetune_deploy.rollout_plan import Mode, Step, plan_rollout
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from finetune_deploy.weight_update import WeightUpdate

log = logging.getLogger(__name__)


class DeployError(RuntimeError):
    """A deploy that could not finish; the pool still serves what it served before."""


class DeployBusy(RuntimeError):
    """Another deploy of the same pool is running."""


class LoraDisabled(RuntimeError):
    """A LoRA adapter for workers started without LoRA support (--enable-lora)."""


@dataclass
class DeployProgress:
    """A deploy as the API and the CLI report it."""

    pool: str
    version: int
    kind: str            # full | lora
    name: str
    action: str          # deploy | rollback | unload
    mode: str            # rolling | all_at_once (full), every_worker (lora)
    in_flight: str = "finish"  # what requests running on a paused worker did: finish | abort | keep
    status: str = "deploying"
    steps_done: int = 0
    steps_total: int = 0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str | None = None
    pauses_s: list[float] = field(default_factory=list)  # each worker's pause: from asking to resumed

    def as_dict(self) -> dict:
        return asdict(self)


WorkerLister = Callable[[], Awaitable[list[WorkerHandle]]]


class HostTierKeys(Protocol):
    """What a worker's host-tier KV is keyed by (engine/kv_tier/policy.py): the deployer says so before new
    weights serve, so KV of other weights is never looked up."""

    async def full_weights(self, worker: WorkerHandle, version: PolicyVersion) -> None: ...

    async def adapter(self, worker: WorkerHandle, name: str, version: PolicyVersion | None) -> None: ...


class Deployer:
    def __init__(self, registry: CheckpointRegistry, models: ModelTable, list_workers: WorkerLister,
                 settings: DeploySettings, host_tier: HostTierKeys | None = None, lora_enabled: bool = False,
                 own_dirs: Sequence[Path] = ()):
        self.registry = registry
        # Where checkpoints may be registered from: the operator's roots and the server's own directories
        # (`own_dirs`: its cache dir, models; its state dir, pushed weights). Empty by default: closed, not open.
        self.checkpoint_roots = [*own_dirs, *settings.checkpoint_roots]
        self.lora_enabled = lora_enabled  # the workers started with --enable-lora
        self.models = models
        self.list_workers = list_workers
        self.settings = settings
        self.host_tier = host_tier  # None: the workers run without the KV tier
        self.history: list[DeployProgress] = []
        self.paused_since: dict[str, float] = {}  # worker name -> time.monotonic() when its pause began
        self.on_pause_ended: Callable[[float], None] | None = None  # seconds a worker was paused (metrics)
        self._lock = asyncio.Lock()
        self._in_flight = settings.in_flight    # of the deploy running now
        self._running_kv = settings.running_kv  # of the deploy running now (in_flight keep)

    @property
    def pool(self) -> str:
        return self.settings.pool

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def latest(self, version: int) -> DeployProgress | None:
        return next((p for p in reversed(self.history) if p.version == version), None)

    # ---- what the API asks for ---------------------------------------------------------------

    async def register_and_deploy(self, update: WeightUpdate, mode: Mode | None = None, in_flight: str | None = None,
                                  registered: asyncio.Future | None = None,
                                  running_kv: RunningKv | None = None) -> DeployProgress:
        """Registers a checkpoint and moves the pool to it; returns when done. `registered` (if given) learns the
        version as soon as it is numbered, for a caller that answers before the deploy ends.

        The pool's deploy lock is held from before the registration, so a second deploy is refused before it
        registers anything. Registering reads and hashes every weight file (seconds for a large checkpoint), so
        it runs in a worker thread, as does every registry write: the event loop carries every stream."""
        async with self._claim():
            version = await asyncio.to_thread(self._register, update)
            _tell(registered, version)
            return await self._deploy(version, mode, "deploy", in_flight, running_kv)

    async def rollback(self, to_version: int | None = None, message: str = "",
                       registered: asyncio.Future | None = None) -> DeployProgress:
        """Moves the pool back to the version that served before (or `to_version`); as `register_and_deploy`."""
        async with self._claim():
            target = await asyncio.to_thread(self.registry.rollback, self.pool, message, to_version)
            _tell(registered, target)
            return await self._deploy(target, None, "rollback", None)

    async def unload_adapter(self, name: str) -> DeployProgress:
        serving = await asyncio.to_thread(self.registry.serving_adapters, self.pool)
        adapter = next((a for a in serving if a.name == name), None)
        if adapter is None:
            raise DeployError(f"pool {self.pool!r} serves no adapter named {name!r}")
        async with self._lock:
            workers = await self.list_workers()
            progress = DeployProgress(self.pool, adapter.version, "lora", name, "unload", "every_worker",
                                      steps_total=len(workers))
            self.history.append(progress)
            # A worker that cannot (most often one restarted without it) does not stop this: the adapter leaves
            # the model table below, so no request reaches it on any worker.
            errors = await _unload_quietly(name, workers)
            progress.steps_done, progress.error = len(workers), "; ".join(errors) or None
            self.models.adapter_unloaded(name)
            await asyncio.to_thread(self.registry.unload_adapter, self.pool, name)
            progress.status, progress.finished_at = "retired", time.time()
            return progress

    async def pause_all(self) -> None:
        for worker in await self.list_workers():
            await self.pause_worker(worker)

    async def resume_all(self) -> None:
        for worker in await self.list_workers():
            await self.resume_worker(worker)

    async def pause_worker(self, worker: WorkerHandle) -> None:
        self.paused_since.setdefault(worker.name, time.monotonic())
        await WorkerControl(worker).pause(self._pause_mode())

    async def resume_worker(self, worker: WorkerHandle, progress: DeployProgress | None = None) -> None:
        await WorkerControl(worker).resume()
        since = self.paused_since.pop(worker.name, None)
        if since is not None:
            paused_s = time.monotonic() - since
            if progress is not None:
                progress.pauses_s.append(round(paused_s, 4))
            if self.on_pause_ended is not None:
                self.on_pause_ended(paused_s)

    async def restore(self) -> None:
        """After a restart the workers run the base weights: put back what the registry says serves."""
        current = await asyncio.to_thread(self.registry.current, self.pool)
        if (current is not None and current.version != self.models.base.policy_version
                and await self._unchanged_for_restore(current)):
            log.info("pool %s: restoring version %d (%s)", self.pool, current.version, current.path)
            await self._apply_everywhere(current)
        for adapter in await self._serving_adapters():
            if not await self._unchanged_for_restore(adapter):
                continue
            log.info("pool %s: reloading adapter %s version %d", self.pool, adapter.name, adapter.version)
            workers = await self.list_workers()
            progress = await self._start(adapter, "restore", "every_worker", len(workers))
            await self._load_adapter(adapter, workers, progress)

    async def _unchanged_for_restore(self, version: RegisteredVersion) -> bool:
        """A version whose files changed while the server was down is not restored: the workers keep the base
        weights (and the model table says so), and the error says why."""
        try:
            await asyncio.to_thread(self.registry.verify_unchanged, version)
        except CheckpointChanged as exc:
            log.error("pool %s: version %d (%s) is not restored: %s", self.pool, version.version, version.name,
                      exc.message)
            return False
        return True

    def weights_for_new_workers(self) -> tuple[Path, PolicyVersion]:
        """The checkpoint a worker started or restarted now loads (engine/supervisor/pools.py): the full weights
        the pool serves, checked unchanged first (CheckpointChanged: the worker is not started; the supervisor
        logs why and tries again at its next check). The base model is what every worker starts on, unchecked."""
        served = self.models.base
        if served.policy_version != BASE_VERSION:
            self.registry.verify_unchanged(self.registry.get(self.pool, served.policy_version))
        return Path(served.path), served.policy_version

    async def load_serving_adapters(self, workers: list[WorkerHandle]) -> None:
        """Gives workers started after the deploys (restarted or scaled up: they start on the served weights,
        engine/supervisor/pools.py) the adapters served beside those weights."""
        for adapter in await self._serving_adapters():
            for worker in workers:
                await self._load_lora(worker, adapter)
            log.info("pool %s: adapter %s version %d loaded on %s", self.pool, adapter.name, adapter.version,
                     ", ".join(w.name for w in workers))

    async def _serving_adapters(self) -> list[RegisteredVersion]:
        adapters = await asyncio.to_thread(self.registry.serving_adapters, self.pool)
        if adapters and not self.lora_enabled:
            log.warning("pool %s: adapters %s are registered as serving, but the workers run without LoRA "
                        "support (start them with --enable-lora to serve them)", self.pool,
                        ", ".join(a.name for a in adapters))
            return []
        return adapters

    def _register(self, update: WeightUpdate) -> RegisteredVersion:
        """Validates and numbers a checkpoint (CheckpointError / RegistryError / LoraDisabled when refused);
        touches no worker. Only under the deploy lock (`register_and_deploy`): a second deploy must not register."""
        path = resolve_under_roots(update.path, self.checkpoint_roots)
        if update.kind == "lora" and not self.lora_enabled:
            raise LoraDisabled(f"the workers of pool {self.pool!r} run without LoRA support, so they cannot load "
                               "an adapter: start them with `rollout-serve up --enable-lora` (or "
                               "ROLLOUT_SERVE_ENABLE_LORA=true), or deploy the adapter merged into full weights")
        return self.registry.register(self.pool, path, name=update.name, kind=update.kind, version=update.version)

    @contextlib.asynccontextmanager
    async def _claim(self):
        """The pool's deploy lock, or DeployBusy at once when another deploy holds it."""
        await self.hold()
        try:
            yield
        finally:
            self._lock.release()

    async def hold(self, in_flight: str | None = None, running_kv: RunningKv | None = None) -> None:
        """Takes the pool's deploy lock (DeployBusy at once when another deploy holds it) for a deploy that
        pauses workers with `in_flight` (None: the setting's). `release` gives it back."""
        if self.busy:
            raise DeployBusy(f"a deploy of pool {self.pool!r} is running; wait for it to finish")
        await self._lock.acquire()
        self._in_flight = in_flight or self.settings.in_flight
        self._running_kv = running_kv or self.settings.running_kv

    def release(self) -> None:
        self._lock.release()

    @property
    def running_kv(self) -> RunningKv:
        """Of the deploy running now (in_flight keep)."""
        return self._running_kv

    async def _deploy(self, version: RegisteredVersion, mode: Mode | None, action: str,
                      in_flight: str | None, running_kv: RunningKv | None = None) -> DeployProgress:
        """Moves the pool to a registered (or, for a rollback, re-activated) version; the caller holds the lock."""
        self._in_flight = in_flight or self.settings.in_flight
        self._running_kv = running_kv or self.settings.running_kv
        workers = await self.list_workers()
        if version.kind == "lora":
            progress = await self._start(version, action, "every_worker", len(workers))
            return await self._finish(progress, self._load_adapter(version, workers, progress))
        mode = mode or self.settings.mode
        if mode == "rolling" and len(workers) < 2:
            mode = "all_at_once"
        disaggregated = any(w.role != "aggregated" for w in workers)
        if disaggregated and mode == "rolling":
            # Any prefill worker may hand a request to any decode worker: one at a time, a request could be
            # prefilled by one version and decoded by another. All at once, none is.
            log.info("pool %s: prefill and decode workers move together (all_at_once), not rolling", self.pool)
            mode = "all_at_once"
        if disaggregated and self._in_flight == "keep":
            # Requests reach prefill/decode workers through Dynamo's frontend, which carries no per-token
            # versions: a request kept across the update could not say which weights sampled which token.
            log.info("pool %s: in_flight keep needs aggregated workers; requests in flight finish first", self.pool)
            self._in_flight = "finish"
        steps = self._plan(workers, mode, version)
        progress = await self._start(version, action, mode, len(steps))
        return await self._finish(progress, self._roll(version, workers, steps, progress))

    # ---- full weights --------------------------------------------------------------------------

    async def _roll(self, version: RegisteredVersion, workers: list[WorkerHandle], steps: list[Step],
                    progress: DeployProgress) -> None:
        by_name = {w.name: w for w in workers}
        old = await asyncio.to_thread(self.registry.current, self.pool)
        paused: set[str] = set()
        switched: set[str] = set()
        try:
            for step in steps:
                await self._run_step(step, by_name[step.worker], version, paused, switched, progress)
                progress.steps_done += 1
        except (WorkerControlError, CheckpointChanged) as exc:
            await self.put_back(old, [by_name[n] for n in switched], [by_name[n] for n in paused])
            raise DeployError(f"{exc}; the pool still serves version {old.version}") from exc
        self.models.base_switched(version.version, version.path)

    async def _run_step(self, step: Step, worker: WorkerHandle, version: RegisteredVersion, paused: set[str],
                        switched: set[str], progress: DeployProgress) -> None:
        control = WorkerControl(worker)
        if step.action == "pause":
            if self._pause_mode() == "abort" and worker.instance_id is not None:
                self.models.worker_aborting(worker.instance_id)
            await self.pause_worker(worker)
            paused.add(worker.name)
        elif step.action == "update_weights":
            await asyncio.to_thread(self.registry.verify_unchanged, version)  # per worker: a rolling deploy is long
            switched.add(worker.name)  # before the call: a half-done reload must be undone too
            await control.load_weights(Path(version.path), version.version, self._running_kv)
            if worker.instance_id is not None:
                self.models.worker_switched(worker.instance_id, version.version)
        elif step.action == "reset_kv":
            await self.reset_tiers(worker, step.tiers, version.version)
        elif step.action == "resume":
            await self.resume_worker(worker, progress)
            paused.discard(worker.name)

    async def put_back(self, old: RegisteredVersion, switched: list[WorkerHandle], paused: list[WorkerHandle]) -> None:
        """Best effort: old weights on every switched worker, then every paused worker resumes."""
        for worker in switched:
            control = WorkerControl(worker)
            try:
                if worker not in paused:
                    await self.pause_worker(worker)
                    paused.append(worker)
                await asyncio.to_thread(self.registry.verify_unchanged, old)
                await control.load_weights(Path(old.path), old.version)
                await self.reset_tiers(worker, self.tiers(), old.version)
                if worker.instance_id is not None:
                    self.models.worker_switched(worker.instance_id, old.version)
            except (WorkerControlError, CheckpointChanged):
                log.exception("%s: could not go back to version %d", worker.name, old.version)
        for worker in paused:
            try:
                await self.resume_worker(worker)
            except WorkerControlError:
                log.exception("%s: could not resume", worker.name)

    async def _apply_everywhere(self, version: RegisteredVersion) -> None:
        workers = await self.list_workers()
        steps = self._plan(workers, "all_at_once", version)
        await self._roll(version, workers, steps, await self._start(version, "restore", "all_at_once", len(steps)))

    def _plan(self, workers: list[WorkerHandle], mode: Mode, version: RegisteredVersion) -> list[Step]:
        if not workers:  # a pool scaled to zero: the workers it starts later load the version it serves
            return []
        return plan_rollout([w.name for w in workers], mode, version.version, version.path, "full",
                            kv_tiers=self.tiers())

    async def reset_tiers(self, worker: WorkerHandle, tiers: tuple[str, ...], version: PolicyVersion) -> None:
        if "device" in tiers:
            await WorkerControl(worker).flush_cache()
        if "host" in tiers and self.host_tier is not None:
            # Host-tier blocks are keyed by policy version: switching the key is the reset (old blocks age out).
            await self.host_tier.full_weights(worker, version)

    def tiers(self) -> tuple[str, ...]:
        return ("device", "host") if self.host_tier is not None else ("device",)

    def _pause_mode(self) -> PauseMode:
        return {"finish": "wait", "abort": "abort", "keep": "keep"}[self._in_flight]

    # ---- LoRA adapters -------------------------------------------------------------------------

    async def _load_adapter(self, version: RegisteredVersion, workers: list[WorkerHandle],
                            progress: DeployProgress) -> None:
        new_name = version.name not in self.models.adapters
        loaded: list[WorkerHandle] = []
        for worker in workers:
            try:
                await self._load_lora(worker, version)
            except (WorkerControlError, CheckpointChanged) as exc:
                if new_name:  # a half-loaded new adapter would be served by some workers only
                    await _unload_quietly(version.name, loaded)
                raise DeployError(str(exc)) from exc
            loaded.append(worker)
            progress.steps_done += 1
        self.models.adapter_loaded(version.name, version.version, version.path)

    async def _load_lora(self, worker: WorkerHandle, adapter: RegisteredVersion) -> None:
        """Loads an adapter version on one worker, its host-tier KV keyed by that version first: loading it
        waits for the requests of the version it replaces, and holds new ones back until it is loaded."""
        serving = self.models.adapters.get(adapter.name)
        await asyncio.to_thread(self.registry.verify_unchanged, adapter)
        if self.host_tier is not None:
            await self.host_tier.adapter(worker, adapter.name, adapter.version)
        try:
            await WorkerControl(worker).load_lora(adapter.name, Path(adapter.path))
        except WorkerControlError:
            if self.host_tier is not None:  # the worker still runs what it ran
                await self.host_tier.adapter(worker, adapter.name, serving.policy_version if serving else None)
            raise

    # ---- bookkeeping ---------------------------------------------------------------------------

    async def _start(self, version: RegisteredVersion, action: str, mode: str, steps_total: int) -> DeployProgress:
        progress = DeployProgress(self.pool, version.version, version.kind, version.name, action, mode,
                                  self._in_flight, steps_total=steps_total)
        self.history.append(progress)
        if action != "restore":
            message = f"{action}: {mode} over {steps_total} steps"
            if version.status != "deploying":  # a rollback target is already deploying
                await asyncio.to_thread(self.registry.mark_status, self.pool, version.version, "deploying", message)
        log.info("pool %s: %s version %d (%s, %s)", self.pool, action, version.version, version.kind, mode)
        return progress

    async def _finish(self, progress: DeployProgress, work: Awaitable[None]) -> DeployProgress:
        try:
            await work
        except DeployError as exc:
            progress.status, progress.error, progress.finished_at = "failed", str(exc), time.time()
            await asyncio.to_thread(self.registry.mark_status, self.pool, progress.version, "failed", str(exc))
            log.error("pool %s: version %d failed: %s", self.pool, progress.version, exc)
            raise
        progress.status, progress.finished_at = "serving", time.time()
        await asyncio.to_thread(self.registry.mark_status, self.pool, progress.version, "serving",
                                f"{progress.action} done in {progress.finished_at - progress.started_at:.1f}s")
        log.info("pool %s: version %d serving after %.1fs", self.pool, progress.version,
                 progress.finished_at - progress.started_at)
        return progress


def _tell(registered: asyncio.Future | None, version: RegisteredVersion) -> None:
    if registered is not None and not registered.done():
        registered.set_result(version)


async def _unload_quietly(name: str, workers: list[WorkerHandle]) -> list[str]:
    """Unloads adapter `name` from every worker; one that cannot is logged and passed over. Returns their errors."""
    errors = []
    for worker in workers:
        try:
            await WorkerControl(worker).unload_lora(name)
        except WorkerControlError as exc:
            log.warning("%s: could not unload adapter %s: %s", worker.name, name, exc)
            errors.append(str(exc))
    return errors
