"""A trainer's weights pushed to a pool without a checkpoint on the way: vLLM's weight-transfer flow
(init -> start -> update -> finish) run on every worker of the pool at once, and the recorder, which keeps what
was pushed as a checkpoint.

A round, as the trainer's calls drive it (rollout_server/routes/weight_transfer.py):
- connect(init_info): every worker joins the trainer's group at rank 1 + its index, and the recorder (this
  process) at the last rank. Once per trainer; the group serves every round after.
- start(in_flight, running_kv): the pool's deploy lock is taken (DeployBusy while a deploy or another round
  runs), every worker is paused (in_flight keep: its requests frozen) and told a round begins.
- update(update_info): every worker and the recorder receive the tensors listed while the trainer broadcasts
  them; returns when all have them. A round may have several.
- finish(version): the version is checked first (above every version the pool ever had). Then, per worker:
  vLLM's finish (its label becomes `version`, `running_kv` applied), its host-tier KV keyed by `version`,
  resumed: the pause ends there. Off the pause, the recorder writes the round as a checkpoint, and the registry
  records it as the serving version; then the lock is released.
A round that fails puts every worker back on the weights that served before it (from their checkpoint),
resumes them, and releases the lock: the pool serves what it served.

Rules: all workers move together (one broadcast reaches them all), so a request never meets two versions
across workers; the recorder's checkpoint has the base model's files around the pushed tensors, so a
restarted worker, a restore and a rollback load a pushed version like any other.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine import gloo_weights
from engine.gloo_weights import GlooInitInfo, GlooUpdateInfo
from engine.ids import BASE_VERSION, PolicyVersion
from engine.supervisor.worker_control import WorkerControl, WorkerControlError, WorkerHandle
from engine.weight_stamps import RunningKv
from finetune_deploy.checkpoint_files import STABLE_MARKER
from finetune_deploy.executor import Deployer, DeployError, DeployProgress
from finetune_deploy.registry import RegistryError

log = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")  # the base model's files not copied beside pushed weights


def _answers(address: str, port: int, timeout_s: float = 5.0) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


class TransferRefused(RuntimeError):
    """A call the pool's state refuses (`code`: out of order, a group that does not fit the pool, a rendezvous
    nobody answers at; `field`: the field of the call it is about), or (`bad_field`) info that does not fit."""

    def __init__(self, message: str, code: str = "weight_transfer_out_of_order", field: str | None = None,
                 bad_field: bool = False):
        super().__init__(message)
        self.code, self.field, self.bad_field = code, field, bad_field


@dataclass
class _Connection:
    workers: list[WorkerHandle]
    group: object  # the recorder's place in the trainer's gloo group
    bucket_bytes: int
    timeout_s: float  # a round left this long with no call running is undone (a trainer gone between calls)


class WeightTransfer:
    def __init__(self, deployer: Deployer, pushed_dir: Path):
        self.deployer = deployer
        self.pushed_dir = pushed_dir  # where the recorder writes each pushed version (v<N>/)
        self._connection: _Connection | None = None
        self._round: list[list[tuple[str, torch.Tensor]]] | None = None  # what the recorder received, by bucket
        self._progress: DeployProgress | None = None
        self._calls = 0  # the round's calls, counted as each begins and ends: even while none runs (the watchdog)
        self._watchdog: asyncio.Task | None = None

    @property
    def backend(self) -> str:
        return gloo_weights.BACKEND

    async def world_size(self) -> int:
        """Receiving ranks: one per worker, and the recorder (the trainer's group is one more: the trainer)."""
        return len(await self.deployer.list_workers()) + 1

    async def connect(self, init_info: dict) -> None:
        if self._round is not None:
            raise TransferRefused("a round is running: finish it before connecting again")
        workers = await self.deployer.list_workers()
        try:
            info = GlooInitInfo(**{"rank_offset": 1, **init_info})
        except TypeError as exc:
            raise TransferRefused(f"init_info: {exc}", bad_field=True) from None
        receivers = len(workers) + 1
        if info.world_size != 1 + receivers:
            raise TransferRefused(f"init_info.world_size is {info.world_size}; pool {self.deployer.pool!r} receives "
                                  f"on {receivers} ranks ({len(workers)} workers and the recorder), so the "
                                  f"trainer's group has {1 + receivers}", "world_size_mismatch", "init_info.world_size")
        if not await asyncio.to_thread(_answers, info.master_address, info.master_port):
            raise TransferRefused(f"nothing answers at {info.master_address}:{info.master_port}, the trainer's "
                                  "rendezvous: the trainer (rank 0) hosts it before asking", "rendezvous_unreachable",
                                  "init_info.master_address")
        self._connection = None
        joins = [WorkerControl(w).join_weight_transfer({**init_info, "rank_offset": 1 + i})
                 for i, w in enumerate(workers)]
        recorder = asyncio.to_thread(gloo_weights.join, info.master_address, info.master_port, receivers,
                                     info.world_size, info.timeout_s)
        try:
            *_, group = await asyncio.gather(*joins, recorder)
        except (WorkerControlError, RuntimeError) as exc:  # a worker's refusal; the rendezvous timing out
            raise DeployError(f"the trainer's group could not form: {exc}") from exc
        self._connection = _Connection(workers, group, info.bucket_bytes, info.timeout_s)
        log.info("pool %s: trainer connected (%s, %d workers and the recorder)", self.deployer.pool, self.backend,
                 len(workers))

    async def start(self, in_flight: str | None = None, running_kv: RunningKv | None = None) -> None:
        connection = self._require_connection()
        if self._round is not None:
            raise TransferRefused("a round is already running: finish it first")
        in_flight = in_flight or "keep"
        if in_flight == "keep" and any(w.role != "aggregated" for w in connection.workers):
            in_flight = "finish"  # as a deploy: Dynamo's frontend carries no per-token versions (executor.py)
        await self.deployer.hold(in_flight, running_kv)
        self._round, self._calls = [], 0
        self._watchdog = asyncio.create_task(self._undo_when_left_idle(connection.timeout_s))
        self._progress = DeployProgress(self.deployer.pool, -1, "full", "pushed", "push", "all_at_once", in_flight,
                                        steps_total=len(connection.workers))  # its version: known at finish
        self.deployer.history.append(self._progress)
        try:
            for worker in connection.workers:
                await self.deployer.pause_worker(worker)
            await asyncio.gather(*(WorkerControl(w).start_weight_update() for w in connection.workers))
        except WorkerControlError as exc:
            await self._fail(exc)

    async def update(self, update_info: dict) -> None:
        connection = self._require_round()
        try:
            update = GlooUpdateInfo(**update_info)
        except (TypeError, ValueError) as exc:
            raise TransferRefused(f"update_info: {exc}", bad_field=True) from None
        receiving = asyncio.to_thread(self._record, connection, update)
        self._calls += 1
        try:
            await asyncio.gather(*(WorkerControl(w).receive_weights(update_info) for w in connection.workers),
                                 receiving)
        except (WorkerControlError, RuntimeError) as exc:  # a worker's error; gloo's on the recorder
            await self._fail(exc)
        finally:
            self._calls += 1

    async def finish(self, version: PolicyVersion) -> DeployProgress:
        connection = self._require_round()
        self._watchdog.cancel()
        progress = self._progress
        progress.version = version
        highest = await asyncio.to_thread(self.deployer.registry.highest_version, self.deployer.pool)
        if version <= highest:
            error = RegistryError(f"version {version} is not above version {highest}, the highest pool "
                                  f"{self.deployer.pool!r} ever had: versions are never reused")
            await self._fail(error, raise_as=error)
        try:
            for worker in connection.workers:
                await WorkerControl(worker).finish_weight_update(version, self.deployer.running_kv)
                if worker.instance_id is not None:
                    self.deployer.models.worker_switched(worker.instance_id, version)
                await self.deployer.reset_tiers(worker, self.deployer.tiers(), version)
                await self.deployer.resume_worker(worker, progress)
                progress.steps_done += 1
        except WorkerControlError as exc:
            await self._fail(exc)
        try:
            registry, pool = self.deployer.registry, self.deployer.pool
            base = await asyncio.to_thread(registry.get, pool, BASE_VERSION)
            path = await asyncio.to_thread(self._write_checkpoint, version, Path(base.path))
            await asyncio.to_thread(registry.register, pool, path, f"pushed-v{version}", "full", version)
            await asyncio.to_thread(registry.mark_status, pool, version, "deploying", "pushed by a trainer")
            await asyncio.to_thread(registry.mark_status, pool, version, "serving",
                                    f"push done in {time.time() - progress.started_at:.1f}s")
            self.deployer.models.base_switched(version, str(path))
            progress.status = "serving"
        except Exception as exc:  # the workers serve the version; only its checkpoint is missing
            progress.status, progress.error = "unrecorded", f"{exc}"
            log.exception("pool %s: version %d serves but was not recorded", self.deployer.pool, version)
        finally:
            progress.finished_at = time.time()
            self._round, self._progress = None, None
            self.deployer.release()
        log.info("pool %s: pushed version %d serving (pauses %s s)", self.deployer.pool, version, progress.pauses_s)
        return progress

    async def disconnect(self) -> None:
        connection = self._require_connection()
        if self._round is not None:
            raise TransferRefused("a round is running: finish it before disconnecting")
        self._connection = None
        try:
            for worker in connection.workers:
                await WorkerControl(worker).leave_weight_transfer()
        except WorkerControlError as exc:
            raise DeployError(str(exc)) from exc

    # ---- the recorder ----------------------------------------------------------------------------

    def _record(self, connection: _Connection, update: GlooUpdateInfo) -> None:
        for bucket in gloo_weights.receive(connection.group, update, connection.bucket_bytes):
            self._round.append(bucket)

    def _write_checkpoint(self, version: PolicyVersion, base: Path) -> Path:
        """The round's tensors (one safetensors file) beside the base model's other files, marked complete."""
        target = self.pushed_dir / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for file in base.iterdir():
            if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and file.name not in (
                    STABLE_MARKER, "manifest.json", "model.safetensors.index.json"):
                shutil.copy2(file, target / file.name)
        tensors = {name: tensor.contiguous() for bucket in self._round for name, tensor in bucket}
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
        (target / STABLE_MARKER).touch()
        return target

    # ---- failures --------------------------------------------------------------------------------

    async def _undo_when_left_idle(self, timeout_s: float) -> None:
        """Undoes the round once `timeout_s` pass with no call of it running and none made (the trainer gone)."""
        seen = -1
        while True:
            await asyncio.sleep(timeout_s)
            if self._calls == seen and self._calls % 2 == 0:
                break
            seen = self._calls
        try:
            await self._fail(TimeoutError(f"the trainer left the round idle for {timeout_s:g} s"))
        except DeployError:
            pass  # logged by _fail

    async def _fail(self, error: Exception, raise_as: Exception | None = None):
        """Every worker back on the weights that served before the round, resumed; the lock released."""
        connection, progress = self._connection, self._progress
        self._round, self._progress = None, None
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        old = await asyncio.to_thread(self.deployer.registry.current, self.deployer.pool)
        for worker in connection.workers:
            try:  # ends vLLM's round (a worker refuses the next one while one is open)
                await WorkerControl(worker).finish_weight_update(old.version, self.deployer.running_kv)
            except WorkerControlError:
                pass
        try:
            await self.deployer.put_back(old, connection.workers, list(connection.workers))
        finally:
            self.deployer.release()
        if progress is not None:
            progress.status, progress.error, progress.finished_at = "failed", str(error), time.time()
        log.error("pool %s: pushed round failed (%s); the pool serves version %d", self.deployer.pool, error,
                  old.version)
        raise raise_as or DeployError(f"{error}; the pool still serves version {old.version}") from error

    def _require_connection(self) -> _Connection:
        if self._connection is None:
            raise TransferRefused("no trainer connected: init_weight_transfer_engine first")
        return self._connection

    def _require_round(self) -> _Connection:
        connection = self._require_connection()
        if self._round is None:
            raise TransferRefused("no round started: start_weight_update first")
        return connection
