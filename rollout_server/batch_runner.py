"""Runs batch lines in the background, at low priority, through an injected `execute`.

`execute(url, body, who) -> (status_code, body_dict)` is what serves one request
(the app binds it to the front door's handlers). The runner keeps at most
`max_in_flight` lines running, starts no new line while `should_yield()` is true
(interactive load comes first; lines already running finish), and finalizes each
batch when its last line is done or when it is cancelled or expires.

Every line runs as the key that created its batch, so it counts against that key's
rate limits (rollout_server/quotas.py) as the key's interactive requests do. A line
over a limit waits, as OpenAI's Batch API queues: it keeps its slot, sleeps the 429's
Retry-After and runs again, never failing for the limit, so a batch goes no faster
than its key's limits allow. A line still waiting when the runner stops is left
running in the store, to run at the next start (`recover()`): it never ran.

Given a retention rule, the runner also sweeps the store's files (`BatchStore.sweep`) at
start and every retention_sweep_s; `files_expired` counts the files removed since start.

    runner = BatchRunner(store, execute, max_in_flight=4, should_yield=lambda: busy())
    await runner.start()     # recovers lines a previous process left running
    runner.wake()            # a batch was created or cancelled: look now
    await runner.stop()      # waits for the lines in flight (nothing runs twice)

See batches.py for the exactly-once argument.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from rollout_server.auth import Principal
from rollout_server.batches import BatchStore, LineResult, LineTask
from rollout_server.errors import APIError

log = logging.getLogger(__name__)

Execute = Callable[[str, dict, Principal], Awaitable[tuple[int, dict]]]


class BatchRunner:
    def __init__(self, store: BatchStore, execute: Execute, *, max_in_flight: int = 4,
                 should_yield: Callable[[], bool] = lambda: False, poll_s: float = 1.0,
                 yield_sleep_s: float = 0.5, clock: Callable[[], float] = time.time,
                 retention_days: float | None = None, retention_bytes_per_team: int | None = None,
                 retention_sweep_s: float = 3600.0):
        self.store = store
        self.execute = execute
        self.max_in_flight = max_in_flight
        self.should_yield = should_yield
        self.poll_s = poll_s
        self.yield_sleep_s = yield_sleep_s
        self.clock = clock
        self.retention_days = retention_days
        self.retention_bytes_per_team = retention_bytes_per_team
        self.retention_sweep_s = retention_sweep_s
        self.files_expired = 0            # files the retention sweeps removed since start
        self._in_flight: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()   # set by stop(): ends the waits of lines over their key's rate limit
        self._waiting = 0                 # lines in flight that wait out their key's rate limit
        self._loop_task: asyncio.Task | None = None
        self._sweep_task: asyncio.Task | None = None
        self._finalize_checked_at = 0.0

    async def start(self) -> None:
        recovered = await asyncio.to_thread(self.store.recover)
        if recovered:
            log.warning("batch runner: %d line(s) left running by the previous process will run again", recovered)
        self._loop_task = asyncio.create_task(self._run(), name="batch-runner")
        if self.retention_days is not None or self.retention_bytes_per_team is not None:
            self._sweep_task = asyncio.create_task(self._sweep_files(), name="batch-retention")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stops starting lines, waits for those in flight to finish and be stored."""
        self._stopping = True
        self._stopped.set()
        self.wake()
        if self._loop_task is not None:
            await self._loop_task
        if self._sweep_task is not None:
            await self._sweep_task
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        """Lines running in the engine's path (those waiting out their key's rate limit are not)."""
        return len(self._in_flight) - self._waiting

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._step()
            except Exception:
                log.exception("batch runner step failed; retrying in %.1f s", self.poll_s)
                await self._sleep(self.poll_s)

    async def _step(self) -> None:
        if self.should_yield():
            await self._sleep(self.yield_sleep_s)
            return
        free = self.max_in_flight - len(self._in_flight)
        if free == 0:
            await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
            return
        tasks = await asyncio.to_thread(self.store.claim, free, self.clock())
        for task in tasks:
            self._spawn(task)
        queue_ran_dry = len(tasks) < free
        # A cancelled or expired batch is finalized even while another batch keeps every slot busy.
        if queue_ran_dry or time.monotonic() - self._finalize_checked_at >= self.poll_s:
            await self._finalize_ready()
        if queue_ran_dry:
            await self._sleep(self.poll_s)

    def _spawn(self, task: LineTask) -> None:
        running = asyncio.create_task(self._run_line(task), name=f"batch-line-{task.batch_id}-{task.line_no}")
        self._in_flight.add(running)
        running.add_done_callback(self._in_flight.discard)

    async def _run_line(self, task: LineTask) -> None:
        result = await self._execute_within_limits(task)
        if result is None:
            return  # stopped while waiting for its rate limit: the line stays running, to run at the next start
        try:
            stored = await asyncio.to_thread(self.store.finish_line, task, result, self.clock())
        except Exception:
            # The line stays running, so its batch waits; the next start-up runs it again (recover()).
            log.exception("storing the result of batch %s line %d failed", task.batch_id, task.line_no)
            return
        if not stored:
            log.error("batch %s line %d was not running when its result came back; result dropped",
                      task.batch_id, task.line_no)
        self.wake()   # a batch may just have finished

    async def _execute_within_limits(self, task: LineTask) -> LineResult | None:
        """The line's result, once its key's rate limits let it run; None if the runner stops meanwhile."""
        while True:
            result = await self._execute(task)
            wait_s = _rate_limit_wait(result)
            if wait_s is None:
                return result
            log.info("batch %s line %d waits %d s for its key's rate limit", task.batch_id, task.line_no, wait_s)
            self._waiting += 1
            try:
                await asyncio.wait_for(self._stopped.wait(), wait_s)
                return None
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiting -= 1

    async def _execute(self, task: LineTask) -> LineResult:
        try:
            status_code, body = await self.execute(task.url, task.body,
                                                   Principal(task.team, task.key_prefix, is_admin=False))
        except APIError as err:
            return LineResult(err.status, err.body(), err.headers)
        except Exception as exc:
            log.exception("batch %s line %d failed", task.batch_id, task.line_no)
            return LineResult(500, APIError(500, f"Internal error: {type(exc).__name__}: {exc}").body())
        return LineResult(status_code, body)

    async def _finalize_ready(self) -> None:
        self._finalize_checked_at = time.monotonic()
        now = self.clock()
        for batch_id in await asyncio.to_thread(self.store.batches_to_finalize, now):
            status = await asyncio.to_thread(self.store.finalize, batch_id, now)
            log.info("batch %s %s", batch_id, status)

    async def _sweep_files(self) -> None:
        while not self._stopping:
            try:
                swept = await asyncio.to_thread(self.store.sweep, self.retention_days, self.retention_bytes_per_team,
                                                self.clock())
                self.files_expired += swept.files_removed
            except Exception:   # e.g. the database busy or gone: the files stay, the next sweep retries
                log.exception("batch retention sweep failed; the next one retries")
            try:
                await asyncio.wait_for(self._stopped.wait(), self.retention_sweep_s)
            except asyncio.TimeoutError:
                pass

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()


def _rate_limit_wait(result: LineResult) -> int | None:
    """Seconds to wait before the line runs again: its 429's Retry-After when a rate limit refused it; None for
    any other result, a 429 for a request too large for any wait (request_too_large) included."""
    if result.status_code != 429 or result.body.get("error", {}).get("code") != "rate_limit_exceeded":
        return None
    return int(result.headers.get("Retry-After", "1"))
