"""TraceCapture: takes records from the serving path and makes them durable off it.

    record() -> bounded queue -> writer thread: redact, WAL append + one fsync per
    batch (group commit), ack the batch -> every flush_every_* hand the segment
    to the sealer thread: Parquet files, then delete the segment

With settings.ack == "durable" (default) record() returns only after the record's
batch is fsync'ed: that return is the acknowledgement, and the record survives
kill -9 from then on. With "enqueue" it returns once queued.

One bad record never costs its neighbours: each record is redacted and encoded on
its own (trace_pipeline/salvage.py); one that fails loses only its offending fields
(named in `dropped_fields`, counter `fields_dropped`), or, when even that fails, is
refused alone (counter `unstorable`, TraceWriteError to its caller). A WAL write that
fails (disk full, an unwritable directory: any OSError) refuses its batch (counter
`write_errors`). Either way a log line says it, and the front door shows the counters
in /metrics (rollout_trace_records), so no loss is silent.

A third thread sweeps retention (trace_pipeline/retention.py) at start and every
retention_sweep_s: counters `expired` (trace records) and `rewards_expired`.

When the queue is full, settings.full_policy decides: "block" waits for room
(asynchronously in record()); "spill" has the caller append the record to an
overflow WAL segment itself (in a worker thread, fsync'ed, so also durable on
return), sealed with the others later. Nothing is dropped either way; the
`blocked_waits` / `spilled` counters and a log line say it happened.

A seal that fails (an object store that is down, a full disk) leaves its segment in the WAL, where every
acknowledged record stays; the sealer tries the WAL's segments again every seal_retry_s until it succeeds
(counter `seal_errors` per failed try), also when no new record comes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from trace_pipeline import retention
from trace_pipeline.handoff import Handoff
from trace_pipeline.records import TraceRecord
from trace_pipeline.redact import Redactor, redact_record
from trace_pipeline.salvage import UnstorableRecord, prepare
from trace_pipeline.settings import TraceSettings
from trace_pipeline.store import TraceStore
from trace_pipeline.wal import WalSegment

log = logging.getLogger(__name__)

FULL_QUEUE_LOG_EVERY_S = 5.0
# Segments waiting for the sealer; when it lags this far the writer waits (backpressure).
MAX_SEGMENTS_TO_SEAL = 2


class TraceWriteError(RuntimeError):
    """The record could not be written to the WAL; it is not stored."""


@dataclass
class _Queued:
    record: TraceRecord
    # Resolved after the WAL fsync: an asyncio future for record(), a concurrent one
    # for record_sync(), None when ack="enqueue".
    ack: asyncio.Future | concurrent.futures.Future | None


class SpillLog:
    """The overflow WAL segment producers append to when the queue is full."""

    def __init__(self, store: TraceStore):
        self._store = store
        self._segment: WalSegment | None = None
        self._lock = threading.Lock()

    def append(self, payload: bytes) -> None:
        with self._lock:
            if self._segment is None:
                self._segment = self._store.new_segment(prefix="spill")
            self._segment.append([payload])

    def rotate(self) -> WalSegment | None:
        """Hands over the current segment (still open and locked) for sealing."""
        with self._lock:
            segment, self._segment = self._segment, None
            return segment


@dataclass
class _ToSeal:
    segment: WalSegment                      # kept locked until sealed
    records: list[TraceRecord] | None        # None: read them back from the segment file


class TraceCapture:
    def __init__(self, settings: TraceSettings, *, store: TraceStore | None = None,
                 redactor: Redactor | None = None):
        self.settings = settings
        self.store = store or TraceStore.from_settings(settings)
        self._redact = redactor or (redact_record if settings.redact else None)
        self._handoff = Handoff(settings.queue_size)
        self._spill = SpillLog(self.store)
        self._segment: WalSegment | None = None
        self._unsealed: list[TraceRecord] = []     # in self._segment, not yet in Parquet
        self._last_seal = time.monotonic()
        self._to_seal: queue.Queue[_ToSeal | None] = queue.Queue(MAX_SEGMENTS_TO_SEAL)
        self._seal_failed = False
        self._thread: threading.Thread | None = None
        self._sealer: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
        self._last_full_log = 0.0
        self._counts_lock = threading.Lock()
        self._counts = dict(accepted=0, written=0, sealed=0, spilled=0, blocked_waits=0,
                            write_errors=0, unstorable=0, fields_dropped=0, seal_errors=0, recovered=0,
                            expired=0, rewards_expired=0)

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Recovers what a dead writer left in the WAL, then starts the writer thread. When recovery cannot seal
        (an object store that is down), capture starts anyway: the WAL keeps the records and the sealer retries."""
        try:
            self._count("recovered", self.store.recover())
        except Exception:
            log.exception("recovery could not seal the WAL into %s; the WAL keeps it, the sealer retries every "
                          "%s s", self.store.sealed.uri, self.settings.seal_retry_s)
            self._count("seal_errors")
            self._seal_failed = True
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._sealer = threading.Thread(target=self._run_sealer, name="trace-sealer", daemon=True)
        self._sweeper = threading.Thread(target=self._run_sweeper, name="trace-retention", daemon=True)
        self._thread.start()
        self._sealer.start()
        self._sweeper.start()
        log.info("trace capture started: dir=%s ack=%s full_policy=%s queue_size=%d",
                 self.settings.dir, self.settings.ack, self.settings.full_policy,
                 self.settings.queue_size)

    def close(self) -> None:
        """Stops taking records, writes and seals everything queued, closes the store."""
        self._handoff.close()
        self._stop_sweeping.set()
        if self._sweeper is not None:
            self._sweeper.join()
            self._sweeper = None
        if self._thread is not None:
            self._thread.join()     # it queues the last seal, then tells the sealer to stop
            self._sealer.join()
            self._thread = self._sealer = None
        self.store.close()
        log.info("trace capture closed: %s", self.stats)

    # ---- producers ---------------------------------------------------------------

    async def record(self, rec: TraceRecord) -> None:
        """Call from the event loop; never blocks it. Returns when accepted (see module doc)."""
        if not self.settings.enabled:
            return
        durable = self.settings.ack == "durable"
        item = _Queued(rec, asyncio.get_running_loop().create_future() if durable else None)
        if not self._handoff.try_put(item):
            if self.settings.full_policy == "spill":
                await asyncio.to_thread(self._spill_record, rec)
                return
            self._note_full()
            await self._handoff.put_async(item)
        self._count("accepted")
        if item.ack is not None:
            await item.ack

    def record_sync(self, rec: TraceRecord) -> None:
        """Same as record() for threads without an event loop; blocks the calling thread."""
        if not self.settings.enabled:
            return
        durable = self.settings.ack == "durable"
        item = _Queued(rec, concurrent.futures.Future() if durable else None)
        if not self._handoff.try_put(item):
            if self.settings.full_policy == "spill":
                self._spill_record(rec)
                return
            self._note_full()
            self._handoff.put(item)
        self._count("accepted")
        if item.ack is not None:
            item.ack.result()

    @property
    def stats(self) -> dict:
        with self._counts_lock:
            counts = dict(self._counts)
        return dict(queued=len(self._handoff), unsealed=len(self._unsealed), **counts)

    def _spill_record(self, rec: TraceRecord) -> None:
        payload = self._prepare(rec)[1]
        try:
            self._spill.append(payload)
        except OSError as exc:
            self._count("write_errors")
            log.error("spilling the trace record of request %s failed: NOT stored: %s", rec.request_id, exc)
            raise TraceWriteError(str(exc)) from exc
        spilled = self._count("spilled")
        self._log_full(f"spilled the record to disk (spilled={spilled})")

    def _note_full(self) -> None:
        waits = self._count("blocked_waits")
        self._log_full(f"blocking the caller until the writer catches up (blocked_waits={waits})")

    def _log_full(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_full_log >= FULL_QUEUE_LOG_EVERY_S:
            self._last_full_log = now
            log.warning("trace queue full (%d records): %s", self._handoff.capacity, what)

    def _count(self, name: str, n: int = 1) -> int:
        with self._counts_lock:
            self._counts[name] += n
            return self._counts[name]

    def _prepare(self, rec: TraceRecord) -> tuple[TraceRecord, bytes]:
        """The record as stored and its WAL payload; raises TraceWriteError when it is unstorable."""
        try:
            stored, payload = prepare(rec, self._redact)
        except UnstorableRecord as exc:
            self._count("unstorable")
            log.error("trace record of request %s (team %s) NOT stored: %s", rec.request_id, rec.team, exc)
            raise TraceWriteError(str(exc)) from exc
        if stored.dropped_fields:
            self._count("fields_dropped")
            log.warning("trace record of request %s (team %s) stored without %s: they could not be redacted "
                        "or encoded", rec.request_id, rec.team, ", ".join(stored.dropped_fields))
        return stored, payload

    # ---- writer thread -----------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._handoff.take_batch(self.settings.max_batch_records, self._seconds_to_seal())
            try:
                if batch:
                    self._commit(batch)
                if self._seal_due():
                    self._seal()
            except Exception:   # the writer must outlive any one bad batch
                log.exception("trace writer: unexpected error; continuing")
            if not batch and self._handoff.closed and not len(self._handoff):
                break
        self._seal()
        self._to_seal.put(None)

    def _commit(self, batch: list[_Queued]) -> None:
        """One group commit: all records of the batch in one write + fsync, then acks."""
        records, payloads, kept = [], [], []
        for item in batch:
            try:
                record, payload = self._prepare(item.record)
            except TraceWriteError as exc:
                acknowledge([item], exc)   # this record alone
                continue
            records.append(record)
            payloads.append(payload)
            kept.append(item)
        if not kept:
            return
        batch = kept
        try:
            if self._segment is None:
                self._segment = self.store.new_segment()
            self._segment.append(payloads)
        except Exception as exc:
            log.exception("trace WAL write failed: %d records NOT stored", len(batch))
            self._count("write_errors", len(batch))
            acknowledge(batch, TraceWriteError(str(exc)))
            self._seal()   # a failed append may leave a torn frame: never append after it
            return
        self._unsealed.extend(records)
        self._count("written", len(records))
        acknowledge(batch, None)

    def _seconds_to_seal(self) -> float:
        return max(0.0, self.settings.flush_every_s - (time.monotonic() - self._last_seal))

    def _seal_due(self) -> bool:
        if len(self._unsealed) >= self.settings.flush_every_records:
            return True
        return self._seconds_to_seal() == 0.0

    def _seal(self) -> None:
        """Hands the spill segment and the current WAL segment to the sealer thread."""
        self._last_seal = time.monotonic()
        spilled = self._spill.rotate()
        if spilled is not None:
            self._to_seal.put(_ToSeal(spilled, None))
        if self._segment is not None:
            self._to_seal.put(_ToSeal(self._segment, self._unsealed))
            self._segment, self._unsealed = None, []

    # ---- sealer thread -----------------------------------------------------------

    def _run_sealer(self) -> None:
        while True:
            try:   # after a failure, wait at most seal_retry_s for the next job, then retry anyway
                job = self._to_seal.get(timeout=self.settings.seal_retry_s if self._seal_failed else None)
            except queue.Empty:
                self._retry_failed_seals()
                continue
            if job is None:
                break
            try:
                if self._seal_failed:
                    self._retry_failed_seals()
                if job.records is None:
                    self._count("sealed", self.store.seal_wal_file(job.segment.path))
                else:
                    self._count("sealed", self.store.seal(job.segment.path, job.records))
            except Exception:
                # The segment stays on disk (durable); the next seal or start retries it.
                log.exception("sealing %s into Parquet failed; the WAL keeps it for a retry",
                              job.segment.path.name)
                self._count("seal_errors")
                self._seal_failed = True
            finally:
                job.segment.close()

    def _retry_failed_seals(self) -> None:
        """Seals the segments earlier failures left in the WAL (closed, so recovery can claim them)."""
        self._seal_failed = False
        try:
            self._count("sealed", self.store.recover())
        except Exception:
            log.warning("sealing the WAL into %s failed again; the WAL keeps it, the next try is in %s s",
                        self.store.sealed.uri, self.settings.seal_retry_s, exc_info=True)
            self._count("seal_errors")
            self._seal_failed = True

    # ---- retention thread --------------------------------------------------------

    def _run_sweeper(self) -> None:
        while not self._stop_sweeping.is_set():
            try:
                swept = retention.sweep(self.store, self.settings)
                self._count("expired", swept.traces_removed)
                self._count("rewards_expired", swept.rewards_removed)
            except Exception:   # e.g. a full disk while rewriting: the files stay, the next sweep retries
                log.exception("trace retention sweep failed; the next one retries")
            self._stop_sweeping.wait(self.settings.retention_sweep_s)


def acknowledge(batch: list[_Queued], error: Exception | None) -> None:
    """Resolves the batch's acks: one thread-safe wake-up per event loop, not per record."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = defaultdict(list)
    for item in batch:
        if isinstance(item.ack, asyncio.Future):
            by_loop[item.ack.get_loop()].append(item.ack)
        elif item.ack is not None:
            _settle([item.ack], error)
    for loop, acks in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, acks, error)
        except RuntimeError:
            pass   # that loop is closed: nobody waits any more


def _settle(acks: list, error: Exception | None) -> None:
    for ack in acks:
        if ack.done():
            continue   # the caller stopped waiting (cancelled); its record is written anyway
        if error is None:
            ack.set_result(None)
        else:
            ack.set_exception(error)
