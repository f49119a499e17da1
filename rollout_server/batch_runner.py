"""Runs batch lines in the background, at low priority, through an injected `execute`.

`execute(url, body, team) -> (status_code, body_dict)` is what serves one request
(the app binds it to the front door's handlers). The runner keeps at most
`max_in_flight` lines running, starts no new line while `should_yield()` is true
(interactive load comes first; lines already running finish), and finalizes each
batch when its last line is done or when it is cancelled or expires.

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

from rollout_server.batches import BatchStore, LineResult, LineTask
from rollout_server.errors import APIError

log = logging.getLogger(__name__)

Execute = Callable[[str, dict, str], Awaitable[tuple[int, dict]]]


class BatchRunner:
    def __init__(self, store: BatchStore, execute: Execute, *, max_in_flight: int = 4,
                 should_yield: Callable[[], bool] = lambda: False, poll_s: float = 1.0,
                 yield_sleep_s: float = 0.5, clock: Callable[[], float] = time.time):
        self.store = store
        self.execute = execute
        self.max_in_flight = max_in_flight
        self.should_yield = should_yield
        self.poll_s = poll_s
        self.yield_sleep_s = yield_sleep_s
        self.clock = clock
        self._in_flight: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task | None = None
        self._finalize_checked_at = 0.0

    async def start(self) -> None:
        recovered = await asyncio.to_thread(self.store.recover)
        if recovered:
            log.warning("batch runner: %d line(s) left running by the previous process will run again", recovered)
        self._loop_task = asyncio.create_task(self._run(), name="batch-runner")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stops starting lines, waits for those in flight to finish and be stored."""
        self._stopping = True
        self.wake()
        if self._loop_task is not None:
            await self._loop_task
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

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
        result = await self._execute(task)
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

    async def _execute(self, task: LineTask) -> LineResult:
        try:
            status_code, body = await self.execute(task.url, task.body, task.team)
        except APIError as err:
            return LineResult(err.status, err.body())
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

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()
