"""Capacity pools at run time: their Dynamo deployments, health, restarts and the serverless autoscaler.

A pool (engine/supervisor/pool_config.py) runs one or more deployments; a deployment is one `Stack` (a Dynamo
frontend with its own workers and discovery directory), its health (`StackHealth`) and the front door's
client of its workers (an `EngineClient`, made by the caller: engine/client/dispatch.py). The supervisor checks every deployment once a
`check_interval_s`: a deployment with no ready worker is out of rotation until it is healthy again,
a process that died is started again, and a serverless pool gets a worker when a request waits at zero
or its workers are busy, and loses one after `idle_s` without requests. The autoscaler is the policy;
starting and stopping real Dynamo vLLM workers is the mechanism.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from engine.contract import EngineClient
from engine.errors import EngineUnavailable
from engine.ids import DEFAULT_POOL, PolicyVersion, PoolName, SessionId
from engine.sessions import deployment_slot
from engine.settings import EngineSettings
from engine.supervisor.health import StackHealth
from engine.supervisor.pool_config import PoolConfig, pool_ports
from engine.supervisor.stack import Stack, WorkerInfo, stop_stacks, worker_info
from engine.supervisor.worker_control import WorkerHandle

log = logging.getLogger(__name__)

MISSED_CHECKS_TOLERATED = 2  # a deployment whose processes all run leaves rotation after 3 failed checks
UNLISTED_CHECKS_TOLERATED = 2  # a running worker missing from discovery is restarted at the 3rd check that sees it


@dataclass
class Deployment:
    name: str                     # "<pool>/<i>"
    stack: Stack
    client: EngineClient
    ready_workers: int = 0        # from the last health check; 0 = out of rotation
    in_flight: int = 0            # requests streaming from it now
    failed_checks: int = 0        # consecutive checks that found no ready worker while every process ran
    fresh_workers: set[int] = field(default_factory=set)  # (re)started by the supervisor, not yet prepared
    prepare_error: str | None = None                        # why the last preparation of fresh workers failed
    health: StackHealth | None = None                       # None: StackHealth(stack)
    unlisted_checks: dict[int, int] = field(default_factory=dict)  # worker -> consecutive checks it was unlisted

    def __post_init__(self) -> None:
        if self.health is None:
            self.health = StackHealth(self.stack)

    @property
    def healthy(self) -> bool:
        return self.ready_workers > 0


@dataclass
class Pool:
    config: PoolConfig
    deployments: list[Deployment]
    in_flight: int = 0
    waiting: int = 0                                   # requests waiting for a cold start
    last_active: float = field(default_factory=time.monotonic)
    failovers: int = 0                                 # requests moved to another deployment
    cold_starts: int = 0

    @property
    def name(self) -> PoolName:
        return PoolName(self.config.name)

    def serving(self) -> list[Deployment]:
        return [d for d in self.deployments if d.healthy]

    def workers(self) -> int:
        return sum(len(d.stack.workers) for d in self.deployments)

    def ready_workers(self) -> int:
        return sum(d.ready_workers for d in self.deployments)

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.config.kind, "team": self.config.team,
                "workers": self.workers(), "ready_workers": self.ready_workers(),
                "min_workers": self.config.min_workers if self.config.kind == "serverless" else self.workers(),
                "max_workers": self.config.max_workers if self.config.kind == "serverless" else self.workers(),
                "in_flight": self.in_flight, "waiting": self.waiting, "failovers": self.failovers,
                "cold_starts": self.cold_starts,
                "deployments": [{"name": d.name, "url": d.stack.frontend_url, "route": d.client.via,
                                 "in_flight": d.in_flight, "healthy": d.healthy,
                                 "ready_workers": d.ready_workers, "frontend_pid": d.stack.frontend_pid(),
                                 "worker_pids": d.stack.worker_pids()} for d in self.deployments]}


class PoolSet:
    """Every pool of the front door: the default pool (the stack `up` started) and the declared ones."""

    def __init__(self, settings: EngineSettings, pools: list[Pool],
                 client_for: Callable[[Stack], EngineClient] | None = None):
        self.settings = settings
        self.client_for = client_for  # how the front door reaches a deployment's workers
        self.pools: dict[str, Pool] = {pool.name: pool for pool in pools}
        # The checkpoint the pools serve now and its policy version (set by the front door from its deploy
        # registry): a worker started or restarted later loads it.
        self.current_weights: Callable[[], tuple[Path, PolicyVersion]] | None = None
        # What a worker started later loads beside those weights (the LoRA adapters the pools serve).
        self.prepare_workers: Callable[[list[WorkerHandle]], Awaitable[None]] | None = None
        self.closing = False  # set at shutdown: nothing is restarted any more
        self._next_core = 0
        self._wake = asyncio.Event()

    @classmethod
    def build(cls, settings: EngineSettings, default_stack: Stack, declared: list[PoolConfig],
              client_for: Callable[[Stack], EngineClient]) -> PoolSet:
        """The default pool around `default_stack`, and a stack per deployment of each declared pool."""
        pools = cls(settings, [], client_for)
        pools._next_core = len(default_stack.workers)
        default = PoolConfig(name=DEFAULT_POOL, kind="shared", workers=max(1, len(default_stack.workers)))
        pools.add(Pool(default, [pools._deployment(f"{DEFAULT_POOL}/0", default_stack)]))
        block = 0
        for config in declared:
            deployments = []
            for i in range(config.deployments):
                stack = pools._pool_stack(config, block, default_stack)
                deployments.append(pools._deployment(f"{config.name}/{i}", stack))
                block += 1
            pools.add(Pool(config, deployments))
        return pools

    def add(self, pool: Pool) -> None:
        self.pools[pool.name] = pool

    def _deployment(self, name: str, stack: Stack) -> Deployment:
        return Deployment(name, stack, self.client_for(stack))

    def _pool_stack(self, config: PoolConfig, block: int, default_stack: Stack) -> Stack:
        """A declared pool's deployment: aggregated workers on its own block of ports, no KV tier."""
        settings = self.settings.model_copy(update={
            **pool_ports(self.settings.pools.pool_base_port, block),
            "disaggregation": self.settings.disaggregation.model_copy(update={"prefill_workers": 0, "decode_workers": 0}),
            "kv_tier": self.settings.kv_tier.model_copy(update={"enabled": False})})
        workers = [self._new_worker(settings, i) for i in range(config.initial_workers)]
        return Stack(settings, default_stack.model_dir, default_stack.served_model_name, workers=workers,
                     state_dir=default_stack.state_dir, cache_dir=default_stack.cache_dir)

    def _new_worker(self, settings: EngineSettings, index: int) -> WorkerInfo:
        worker = worker_info(settings, index, self._next_core)
        self._next_core += 1
        return worker

    def declared(self) -> list[Pool]:
        return [p for name, p in self.pools.items() if name != DEFAULT_POOL]

    # ---- start and stop ---------------------------------------------------------------------

    def launch(self) -> None:
        """Starts every declared deployment's processes, without waiting for them."""
        for stack in self._declared_stacks():
            stack.start()

    def wait_until_ready(self) -> None:
        """Waits until every declared deployment serves (a serverless one at zero: until its frontend
        answers); stops them all if one fails."""
        try:
            for deployment in self._declared_deployments():
                deployment.health.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        for pool in self.declared():
            log.info("pool %s (%s%s): %d deployment(s), %d worker(s)", pool.name, pool.config.kind,
                     f", team {pool.config.team}" if pool.config.team else "", len(pool.deployments), pool.workers())

    def engine_cores(self, role: str | None = None) -> set[int]:
        """The cores the workers of every deployment (only those in `role`, if given) are pinned to now."""
        return {w.cpu for p in self.pools.values() for d in p.deployments for w in d.stack.workers
                if role in (None, w.role)}

    def _declared_deployments(self) -> list[Deployment]:
        return [d for p in self.declared() for d in p.deployments]

    def _declared_stacks(self) -> list[Stack]:
        return [d.stack for d in self._declared_deployments()]

    def stop(self, *also: Stack) -> None:
        """Stops every declared deployment, and `also` (the default pool's stack), all at once."""
        stop_stacks(self._declared_stacks() + list(also))

    async def close(self) -> None:
        self.closing = True
        for pool in self.pools.values():
            for deployment in pool.deployments:
                await deployment.client.close()

    # ---- requests -----------------------------------------------------------------------------

    async def pick(self, pool: Pool, session_id: SessionId | None, refusals: Counter[str]) -> Deployment:
        """A deployment for a request: the same healthy one for a session while it stays healthy (its KV is
        there); after refusals, one that refused this request fewer times (`least_refused`). A serverless
        pool at zero first waits for a cold start."""
        if not pool.serving() and pool.config.kind == "serverless":
            await self._cold_start(pool)
        fresh = self.least_refused(pool, refusals)
        return fresh[deployment_slot(session_id, len(fresh))]

    @staticmethod
    def least_refused(pool: Pool, refusals: Counter[str]) -> list[Deployment]:
        """The deployments that refused this request the fewest times, those in rotation first. One out of
        rotation is tried before one in rotation that refused more often: on a loaded machine it may only
        have missed its health checks, and the request is lost if every try fails."""
        def rank(d: Deployment) -> tuple[int, bool]:
            return refusals[d.name], not d.healthy
        best = min(map(rank, pool.deployments))
        return [d for d in pool.deployments if rank(d) == best]

    def refused(self, deployment: Deployment) -> None:
        """A deployment refused a request before any output: check its health now, not at the next tick."""
        log.info("deployment %s refused a request: checking its health", deployment.name)
        self._wake.set()

    async def _cold_start(self, pool: Pool) -> None:
        pool.waiting += 1
        self._wake.set()
        started = time.monotonic()
        next_report = started + 10.0
        try:
            while not pool.serving():
                waited = time.monotonic() - started
                if waited > pool.config.cold_start_timeout_s:
                    raise EngineUnavailable(f"pool {pool.name} is starting a worker (cold start) and it was not "
                                            f"ready after {waited:.0f} s; retry shortly")
                crashed = next(filter(None, (d.stack.crashed_worker() for d in pool.deployments)), None)
                if crashed:  # no point waiting out the timeout: the supervisor restarts it, the client retries
                    log.error("pool %s: the worker starting for a request exited: %s", pool.name, crashed)
                    raise EngineUnavailable(f"pool {pool.name}: the worker it was starting exited during start-up "
                                            f"({crashed}) after {waited:.0f} s; retry shortly")
                if time.monotonic() > next_report:
                    log.info("pool %s: a request has waited %.0f s for a cold start", pool.name, waited)
                    next_report += 10.0
                await asyncio.sleep(0.25)
        finally:
            pool.waiting -= 1

    # ---- the supervisor ---------------------------------------------------------------------

    async def supervise(self) -> None:
        """Runs for the life of the front door: health, restarts, scaling."""
        while True:
            try:
                await self.check_once()
            except Exception:
                log.exception("pool supervisor check failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.pools.pool_check_interval_s)
            except asyncio.TimeoutError:
                pass

    async def check_once(self) -> None:
        # All deployments at once: on a loaded machine one slow health probe must not delay noticing a death.
        await asyncio.gather(*(self._check_deployment(pool, d) for pool in self.pools.values() for d in pool.deployments))
        for pool in self.pools.values():
            if pool.config.kind == "serverless":
                await self._autoscale(pool)

    async def _check_deployment(self, pool: Pool, deployment: Deployment) -> None:
        stack = deployment.stack
        # Disaggregated workers are not restarted: a NIXL worker needs its threads settled after start-up.
        nixl_workers = pool.name == DEFAULT_POOL and self.settings.disaggregation.enabled
        was_healthy = deployment.healthy
        if self.settings.pools.restart_dead_workers and not nixl_workers and not self.closing and not stack.all_alive():
            # Out of rotation before the restart, which takes seconds on a loaded machine, and until the
            # deployment passes a check again.
            deployment.ready_workers = deployment.failed_checks = 0
            if was_healthy:
                log.warning("deployment %s lost a process: drained, out of rotation", deployment.name)
            self._follow_served_weights(stack)
            # What restart_dead restarted, not what was dead a moment before: another worker may die meanwhile
            deployment.fresh_workers |= set(await asyncio.to_thread(stack.restart_dead))
            return
        if self.settings.pools.restart_dead_workers and not nixl_workers and not self.closing:
            await self._restart_unlisted(deployment)
        ready = await self._ready_workers(deployment)
        if not ready and was_healthy and stack.all_alive() and deployment.failed_checks < MISSED_CHECKS_TOLERATED:
            deployment.failed_checks += 1  # a health probe that timed out on a loaded machine is not a death
            return
        deployment.failed_checks = 0
        if ready and not was_healthy and not await asyncio.to_thread(deployment.health.serves_a_request):
            ready = 0  # listed and ready, but Dynamo cannot place a request yet: next check
        deployment.ready_workers = ready
        if was_healthy and not deployment.healthy:
            log.warning("deployment %s is unhealthy: drained, out of rotation", deployment.name)
        elif deployment.healthy and not was_healthy:
            log.info("deployment %s is healthy: in rotation (%d ready worker(s))", deployment.name,
                     deployment.ready_workers)

    async def _restart_unlisted(self, deployment: Deployment) -> None:
        """A worker that runs but that Dynamo no longer lists (StackHealth.unlisted_workers) gets no request again:
        after a few checks it is stopped, and the next check restarts it as a dead one (it registers anew)."""
        unlisted = await asyncio.to_thread(deployment.health.unlisted_workers)
        deployment.unlisted_checks = {i: deployment.unlisted_checks.get(i, 0) + 1 for i in unlisted}
        for index, checks in deployment.unlisted_checks.items():
            if checks > UNLISTED_CHECKS_TOLERATED:
                log.warning("deployment %s: worker %d runs but is gone from Dynamo's discovery (its registration "
                            "expired): restarting it", deployment.name, index)
                deployment.stack.worker_children[index].signal_group(signal.SIGKILL)

    async def _autoscale(self, pool: Pool) -> None:
        deployment = pool.deployments[0]
        stack, config = deployment.stack, pool.config
        workers, ready = len(stack.workers), deployment.ready_workers
        starting = workers > ready
        busy = ready and pool.in_flight / ready > config.scale_up_in_flight
        if workers < config.max_workers and not starting and ((pool.waiting and workers == 0) or busy):
            worker = self._new_worker(stack.settings, _free_index(stack))
            log.info("pool %s: scaling up to %d worker(s) (%s)", pool.name, workers + 1,
                     "cold start" if workers == 0 else f"{pool.in_flight} requests in flight")
            self._follow_served_weights(stack)
            deployment.fresh_workers.add(worker.index)
            await asyncio.to_thread(stack.add_worker, worker)
            pool.cold_starts += workers == 0
            return
        idle_for = time.monotonic() - pool.last_active
        if workers > config.min_workers and pool.in_flight == 0 and not pool.waiting and idle_for > config.idle_s:
            log.info("pool %s: idle for %.0f s, scaling down to %d worker(s)", pool.name, idle_for, workers - 1)
            deployment.ready_workers = min(deployment.ready_workers, workers - 1)  # no new request goes to it
            await asyncio.to_thread(stack.remove_worker, stack.workers[-1])
            deployment.ready_workers = await asyncio.to_thread(deployment.health.ready_workers)
            pool.last_active = time.monotonic()  # the next worker goes after another idle period

    async def _ready_workers(self, deployment: Deployment) -> int:
        """The deployment's ready workers; fresh ones among them first load what the pools serve. One that
        cannot yet serves the base model meanwhile (an adapter must not keep a deployment out of rotation)
        and is tried again at the next check."""
        joined = len(await asyncio.to_thread(deployment.health.joined_workers))  # cluster mode: other hosts'
        ready = await asyncio.to_thread(deployment.health.ready_worker_indices)
        fresh = deployment.fresh_workers & set(ready)
        if fresh and self.prepare_workers:
            handles = [h for h in await asyncio.to_thread(deployment.health.worker_handles) if h.index in fresh]
            try:
                await self.prepare_workers(handles)
            except Exception as exc:  # noqa: BLE001 -- tried again at the next check
                if str(exc) != deployment.prepare_error:
                    log.warning("deployment %s: worker(s) %s could not load the served adapters yet: %s",
                                deployment.name, sorted(fresh), exc)
                deployment.prepare_error = str(exc)
                return len(ready) + joined
            log.info("deployment %s: worker(s) %s loaded the served adapters", deployment.name, sorted(fresh))
        deployment.fresh_workers -= fresh
        deployment.prepare_error = None
        return len(ready) + joined

    def _follow_served_weights(self, stack: Stack) -> None:
        if self.current_weights:
            stack.model_dir, stack.policy_version = self.current_weights()

    # ---- introspection --------------------------------------------------------------------------

    def worker_handles(self) -> list[WorkerHandle]:
        """Every worker of every pool, for deploys: a new policy version reaches all of them."""
        return [handle for pool in self.pools.values() for d in pool.deployments for handle in d.health.worker_handles()]


def _free_index(stack: Stack) -> int:
    used = {w.index for w in stack.workers}
    return next(i for i in range(len(used) + 1) if i not in used)
