"""The Batch API's store: uploaded files on disk, batches and per-line progress in SQL.

    <dir>/files/<file_id>.jsonl       input, output and error files
    batch_files, batches, batch_lines  tables (SQLite <dir>/batches.db by default, or PostgreSQL)

A line lives pending -> running -> done (its result stored), or pending -> skipped
when its batch is cancelled or expires first. A batch lives in_progress (or
cancelling) until `finalize()` writes its output and error files and gives it its
final status: completed, cancelled or expired.

Exactly once, across restarts: the runner marks a line running, executes it, then
stores the result and marks the line done in one UPDATE, so no line is ever done
without its result nor has a result while not done. At start-up `recover()` turns
lines left running back to pending: they have no stored result and run again. A
clean stop waits for the lines in flight, so nothing runs twice; after a crash a
line whose execution finished but whose result was not yet committed runs a second
time, and only that second result is stored. Either way, every custom_id appears
exactly once in the output or error file. Output files are written before the
transaction that marks the batch final commits, under names fixed by the batch id,
so a crash while finalizing just finalizes again over the same files.

Ownership: every lookup is by (id, team); another team's file or batch is a 404. A batch also keeps the key that
created it: its lines count against that key's rate limits (rollout_server/batch_runner.py).
One runner per database (claiming lines is not safe against a second runner).

Retention (`sweep()`, which the runner runs at start and every retention_sweep_s) applies the trace store's two
rules (trace_pipeline/retention.py) to files: a file older than retention_days is removed, and a team holding more
than retention_bytes_per_team loses its oldest files until it holds no more (the files its active batches use
count, as they are on disk); other teams' files are never touched. A file an active batch uses (its input, or an
output of a batch finalizing again after a crash) is never removed: the check and the delete are one statement,
and create_batch checks its input file still exists in the transaction that makes the batch active. The row goes
first, then the file: a crash between leaves a file no row points at, never a row without its file. A swept file
is a 404, as one never uploaded; batches keep their records and the ids of swept files, as OpenAI's do.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    case,
    exists,
    func,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine

from rollout_server.batch_input import BATCH_ENDPOINTS, BatchInputError, InputLine, LineError, parse_input_file
from rollout_server.database import open_engine
from rollout_server.errors import APIError, bad_request
from trace_pipeline.retention import age_cutoff, oldest_beyond_budget

log = logging.getLogger(__name__)

COMPLETION_WINDOWS = {"24h": 24 * 3600}
ACTIVE = ("in_progress", "cancelling")
INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
MAX_FILENAME_CHARS = 512


_metadata = MetaData()
batch_files = Table(
    "batch_files", _metadata,
    Column("id", String(64), primary_key=True),
    Column("team", String(128), nullable=False, index=True),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(MAX_FILENAME_CHARS), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
)
batches = Table(
    "batches", _metadata,
    Column("id", String(64), primary_key=True),
    Column("team", String(128), nullable=False, index=True),
    Column("key_prefix", String(16), nullable=True),   # the creator's key (NULL: open local mode, no key)
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False, index=True),
    Column("metadata_json", Text, nullable=True),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("in_progress_at", Float, nullable=True),
    Column("expires_at", Float, nullable=False),
    Column("finalizing_at", Float, nullable=True),
    Column("completed_at", Float, nullable=True),
    Column("cancelling_at", Float, nullable=True),
    Column("cancelled_at", Float, nullable=True),
    Column("expired_at", Float, nullable=True),
)
batch_lines = Table(
    "batch_lines", _metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("line_no", Integer, primary_key=True),
    Column("custom_id", String(512), nullable=False),
    Column("url", String(64), nullable=False),
    Column("byte_offset", BigInteger, nullable=False),
    Column("byte_length", Integer, nullable=False),
    Column("state", String(16), nullable=False),       # pending | running | done | skipped
    Column("status_code", Integer, nullable=True),
    Column("request_id", String(128), nullable=True),
    Column("response_json", Text, nullable=True),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Index("ix_batch_lines_batch_state_line", "batch_id", "state", "line_no"),
)


# ---- data crossing to the runner and the API ------------------------------------------------

@dataclass(frozen=True)
class StoredFile:
    id: str
    team: str
    purpose: str
    filename: str
    bytes: int
    created_at: float

    def to_json(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": "processed"}


@dataclass
class SweepResult:
    files_removed: int = 0
    bytes_removed: int = 0
    by_team: dict[str, int] = field(default_factory=lambda: defaultdict(int))   # files removed


@dataclass(frozen=True)
class LineTask:
    """One claimed line, ready to execute."""

    batch_id: str
    line_no: int
    custom_id: str
    url: str
    team: str
    body: dict
    key_prefix: str | None = None   # the key whose rate limits the line counts against (None: no key)


@dataclass(frozen=True)
class LineResult:
    status_code: int
    body: dict
    headers: dict[str, str] = field(default_factory=dict)   # of an error: Retry-After (the runner reads it)


def open_batch_database(url: str) -> Engine:
    """An engine for the batch tables (SQLite or PostgreSQL: rollout_server/database.py); SQLite gets WAL (readers
    do not wait for the runner's writes). DatabaseError if it cannot be opened."""
    return open_engine(url, sqlite_wal=True)


class BatchStore:
    def __init__(self, engine: Engine, directory: Path, max_lines: int = 50_000):
        self.engine = engine
        self.files_dir = Path(directory) / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.max_lines = max_lines
        _metadata.create_all(engine)
        _add_key_prefix_column(engine)

    # ---- files --------------------------------------------------------------------------

    def save_input_file(self, team: str, filename: str, purpose: str, content: bytes) -> StoredFile:
        """Checks a JSONL batch input (400 naming every bad line) and stores it."""
        if purpose != INPUT_PURPOSE:
            raise bad_request(f"purpose {purpose!r} is not supported; upload batch input with purpose 'batch'",
                              param="purpose", code="invalid_value")
        if len(filename) > MAX_FILENAME_CHARS or "\x00" in filename:  # the column's size; PostgreSQL holds no NUL
            raise bad_request(f"the file's name must be at most {MAX_FILENAME_CHARS} characters, without NUL "
                              "characters", param="file", code="invalid_value")
        try:
            parse_input_file(content, self.max_lines)
        except BatchInputError as exc:
            raise bad_request(str(exc), param="file", code="invalid_batch_input") from exc
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        _write_atomically(self.path_of(file_id), content)
        stored = StoredFile(file_id, team, purpose, filename, len(content), time.time())
        with self.engine.begin() as conn:
            conn.execute(batch_files.insert().values(**asdict(stored)))
        return stored

    def get_file(self, file_id: str, team: str, param: str = "file_id") -> StoredFile:
        with self.engine.connect() as conn:
            row = conn.execute(select(batch_files).where(batch_files.c.id == file_id,
                                                         batch_files.c.team == team)).first()
        if row is None:
            raise _no_such_file(file_id, param)
        return StoredFile(**row._mapping)

    def open_content(self, file_id: str, team: str, param: str = "file_id") -> tuple[StoredFile, BinaryIO]:
        """The file and its bytes, opened: a sweep removing it meanwhile leaves the open handle readable, and one
        that removed it first makes it a 404, as if it never was."""
        stored = self.get_file(file_id, team, param)
        try:
            return stored, open(self.path_of(file_id), "rb")
        except FileNotFoundError:
            raise _no_such_file(file_id, param) from None

    def path_of(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    # ---- batches (the API side) ---------------------------------------------------------

    def create_batch(self, team: str, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict | None = None, key_prefix: str | None = None) -> dict:
        if endpoint not in BATCH_ENDPOINTS:
            raise bad_request(f"endpoint {endpoint!r} is not supported; use one of {', '.join(BATCH_ENDPOINTS)}",
                              param="endpoint", code="invalid_value")
        if completion_window not in COMPLETION_WINDOWS:
            raise bad_request("completion_window must be '24h'", param="completion_window", code="invalid_value")
        stored = self.get_file(input_file_id, team, param="input_file_id")
        if stored.purpose != INPUT_PURPOSE:
            raise bad_request(f"file {input_file_id} has purpose {stored.purpose!r}, not 'batch'",
                              param="input_file_id", code="invalid_value")
        _, source = self.open_content(input_file_id, team, param="input_file_id")
        with source:
            lines = parse_input_file(source.read(), self.max_lines)
        _check_endpoint(lines, endpoint)
        now = time.time()
        batch_id = f"batch_{uuid.uuid4().hex}"
        with self.engine.begin() as conn:
            conn.execute(batches.insert().values(
                id=batch_id, team=team, key_prefix=key_prefix, endpoint=endpoint, input_file_id=input_file_id,
                completion_window=completion_window, status="in_progress",
                metadata_json=json.dumps(metadata) if metadata else None,
                created_at=now, in_progress_at=now, expires_at=now + COMPLETION_WINDOWS[completion_window]))
            conn.execute(batch_lines.insert(), [
                {"batch_id": batch_id, "line_no": line.line_no, "custom_id": line.custom_id, "url": line.url,
                 "byte_offset": line.byte_offset, "byte_length": line.byte_length, "state": "pending"}
                for line in lines])
            # The batch now holds its input file against sweeps (module doc); one may have removed it just before
            if conn.execute(select(batch_files.c.id).where(batch_files.c.id == input_file_id)).first() is None:
                raise _no_such_file(input_file_id, "input_file_id")
            return _batch_json(conn, _batch_row(conn, batch_id, team))

    def get_batch(self, batch_id: str, team: str) -> dict:
        with self.engine.connect() as conn:
            return _batch_json(conn, _batch_row(conn, batch_id, team))

    def list_batches(self, team: str, limit: int = 20, after: str | None = None) -> dict:
        """The team's batches, newest first; `after` is the last id of the previous page."""
        query = select(batches).where(batches.c.team == team)
        with self.engine.connect() as conn:
            if after is not None:
                cursor = _batch_row(conn, after, team)
                query = query.where(or_(batches.c.created_at < cursor.created_at,
                                        and_(batches.c.created_at == cursor.created_at, batches.c.id < cursor.id)))
            rows = conn.execute(query.order_by(batches.c.created_at.desc(), batches.c.id.desc())
                                .limit(limit + 1)).all()
            data = [_batch_json(conn, row) for row in rows[:limit]]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}

    def cancel_batch(self, batch_id: str, team: str) -> dict:
        """in_progress -> cancelling (the runner finishes the lines in flight, then finalizes)."""
        with self.engine.begin() as conn:
            row = _batch_row(conn, batch_id, team)
            if row.status == "in_progress":
                conn.execute(update(batches).where(batches.c.id == batch_id)
                             .values(status="cancelling", cancelling_at=time.time()))
            elif row.status not in ("cancelling", "cancelled"):
                raise bad_request(f"Cannot cancel a batch with status '{row.status}'.", param="batch_id",
                                  code="batch_not_cancellable")
            return _batch_json(conn, _batch_row(conn, batch_id, team))

    # ---- retention (the runner side) ---------------------------------------------------

    def sweep(self, retention_days: float | None, bytes_per_team: int | None,
              now: float | None = None) -> SweepResult:
        """Removes the files the retention rules (module doc) say to, oldest first."""
        cutoff = age_cutoff(retention_days, now)
        with self.engine.connect() as conn:
            files = [StoredFile(**row._mapping) for row in conn.execute(select(batch_files))]
            in_use = {file_id for row in conn.execute(select(batches.c.input_file_id, batches.c.output_file_id,
                                                             batches.c.error_file_id)
                                                      .where(batches.c.status.in_(ACTIVE)))
                      for file_id in row if file_id is not None}
        doomed = [f for f in files if cutoff is not None and f.created_at < cutoff and f.id not in in_use]
        if bytes_per_team is not None:
            kept_by_team: dict[str, list[StoredFile]] = defaultdict(list)
            for f in set(files) - set(doomed):
                kept_by_team[f.team].append(f)
            for kept in kept_by_team.values():
                held_by_active = sum(f.bytes for f in kept if f.id in in_use)
                doomed += oldest_beyond_budget([f for f in kept if f.id not in in_use], lambda f: f.bytes,
                                               lambda f: f.created_at, bytes_per_team - held_by_active)
        result = SweepResult()
        for f in doomed:
            if self._remove_file(f.id):
                result.files_removed += 1
                result.bytes_removed += f.bytes
                result.by_team[f.team] += 1
        if result.files_removed:
            log.info("batch retention: removed %d files (%d bytes) of %s (older than %s days, over %s bytes per "
                     "team)", result.files_removed, result.bytes_removed, dict(result.by_team), retention_days,
                     bytes_per_team)
        return result

    def _remove_file(self, file_id: str) -> bool:
        """Removes the file's row, unless an active batch uses it (one statement), then the file itself."""
        in_use = exists().where(batches.c.status.in_(ACTIVE),
                                or_(batches.c.input_file_id == file_id, batches.c.output_file_id == file_id,
                                    batches.c.error_file_id == file_id))
        with self.engine.begin() as conn:
            removed = conn.execute(batch_files.delete().where(batch_files.c.id == file_id, ~in_use)).rowcount == 1
        if removed:
            self.path_of(file_id).unlink(missing_ok=True)
        return removed

    # ---- lines (the runner side) --------------------------------------------------------

    def recover(self) -> int:
        """At start-up: lines left running (no stored result, see the module doc) run again."""
        with self.engine.begin() as conn:
            result = conn.execute(update(batch_lines).where(batch_lines.c.state == "running")
                                  .values(state="pending", started_at=None))
        return result.rowcount

    def claim(self, limit: int, now: float) -> list[LineTask]:
        """Marks up to `limit` pending lines of the oldest runnable batch running and returns them."""
        with self.engine.begin() as conn:
            for batch in conn.execute(select(batches.c.id, batches.c.team, batches.c.key_prefix, batches.c.input_file_id)
                                      .where(batches.c.status == "in_progress", batches.c.expires_at > now)
                                      .order_by(batches.c.created_at, batches.c.id)).all():
                lines = conn.execute(select(batch_lines).where(batch_lines.c.batch_id == batch.id,
                                                               batch_lines.c.state == "pending")
                                     .order_by(batch_lines.c.line_no).limit(limit)).all()
                if lines:
                    conn.execute(update(batch_lines)
                                 .where(batch_lines.c.batch_id == batch.id,
                                        batch_lines.c.line_no.in_([line.line_no for line in lines]))
                                 .values(state="running", started_at=now))
                    return self._tasks(batch, lines)
        return []

    def finish_line(self, task: LineTask, result: LineResult, now: float) -> bool:
        """Stores the result and marks the line done, in one statement; False if it was not running."""
        request_id = result.body.get("id") if isinstance(result.body.get("id"), str) else None
        with self.engine.begin() as conn:
            updated = conn.execute(
                update(batch_lines)
                .where(batch_lines.c.batch_id == task.batch_id, batch_lines.c.line_no == task.line_no,
                       batch_lines.c.state == "running")
                .values(state="done", status_code=result.status_code, response_json=json.dumps(result.body),
                        request_id=request_id or _output_line_id(task.batch_id, task.line_no), finished_at=now))
        return updated.rowcount == 1

    def batches_to_finalize(self, now: float) -> list[str]:
        """Active batches with nothing running and nothing left to run (done, cancelling or expired)."""
        ready = []
        with self.engine.connect() as conn:
            for batch in conn.execute(select(batches).where(batches.c.status.in_(ACTIVE))).all():
                if _ready_to_finalize(batch, _line_states(conn, batch.id), now):
                    ready.append(batch.id)
        return ready

    def finalize(self, batch_id: str, now: float) -> str:
        """Skips what did not run, writes the output and error files, sets the final status
        (a batch not ready yet, or already final, is left as it is)."""
        with self.engine.begin() as conn:
            batch = conn.execute(select(batches).where(batches.c.id == batch_id)).one()
            states = _line_states(conn, batch_id)
            if not _ready_to_finalize(batch, states, now):
                return batch.status
            status = _final_status(batch, states)
            conn.execute(update(batch_lines).where(batch_lines.c.batch_id == batch_id, batch_lines.c.state == "pending")
                         .values(state="skipped", finished_at=now))
            output_id, error_id = self._write_result_files(conn, batch, status, now)
            conn.execute(update(batches).where(batches.c.id == batch_id).values(
                status=status, output_file_id=output_id, error_file_id=error_id, finalizing_at=now,
                **{f"{status}_at": now}))
        return status

    # ---- helpers ------------------------------------------------------------------------

    def _tasks(self, batch, lines) -> list[LineTask]:
        tasks = []
        with open(self.path_of(batch.input_file_id), "rb") as source:
            for line in lines:
                source.seek(line.byte_offset)
                body = json.loads(source.read(line.byte_length))["body"]
                tasks.append(LineTask(batch.id, line.line_no, line.custom_id, line.url, batch.team, body,
                                      batch.key_prefix))
        return tasks

    def _write_result_files(self, conn: Connection, batch, status: str, now: float) -> tuple[str | None, str | None]:
        output_id, error_id = _result_file_ids(batch.id)
        skipped_error = _skipped_error(status)
        counts = {output_id: 0, error_id: 0}
        paths = {file_id: self.path_of(file_id) for file_id in counts}
        partial = {file_id: path.with_suffix(".partial") for file_id, path in paths.items()}
        with open(partial[output_id], "w") as output, open(partial[error_id], "w") as errors:
            rows = conn.execute(select(batch_lines).where(batch_lines.c.batch_id == batch.id)
                                .order_by(batch_lines.c.line_no))
            for line in rows:
                succeeded = line.state == "done" and 200 <= line.status_code < 300
                (output if succeeded else errors).write(json.dumps(_output_line(batch.id, line, skipped_error)) + "\n")
                counts[output_id if succeeded else error_id] += 1
            for handle in (output, errors):
                handle.flush()
                os.fsync(handle.fileno())
        kept = []
        for file_id, count in counts.items():
            if count == 0:
                partial[file_id].unlink()
                continue
            os.replace(partial[file_id], paths[file_id])
            conn.execute(batch_files.insert().values(
                id=file_id, team=batch.team, purpose=OUTPUT_PURPOSE, bytes=paths[file_id].stat().st_size,
                filename=f"{batch.id}_{'output' if file_id == output_id else 'error'}.jsonl", created_at=now))
            kept.append(file_id)
        return (output_id if output_id in kept else None), (error_id if error_id in kept else None)


# ---- module helpers -----------------------------------------------------------------------

def _add_key_prefix_column(engine: Engine) -> None:
    """A database made before batches kept their key gets the column; its batches have none (NULL), so their
    remaining lines run without a key's limits, as they did."""
    if "key_prefix" not in {column["name"] for column in inspect(engine).get_columns("batches")}:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE batches ADD COLUMN key_prefix VARCHAR(16)"))


def _write_atomically(path: Path, content: bytes) -> None:
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def _no_such_file(file_id: str, param: str) -> APIError:
    return APIError(404, f"No such file: {file_id}", param=param, code="file_not_found")


def _check_endpoint(lines: list[InputLine], endpoint: str) -> None:
    errors = [LineError(line.line_no, f"url {line.url!r} differs from the batch endpoint {endpoint!r}", "url")
              for line in lines if line.url != endpoint]
    if errors:
        raise bad_request(str(BatchInputError(errors)), param="input_file_id", code="invalid_batch_input")


def _batch_row(conn: Connection, batch_id: str, team: str):
    row = conn.execute(select(batches).where(batches.c.id == batch_id, batches.c.team == team)).first()
    if row is None:
        raise APIError(404, f"No such batch: {batch_id}", param="batch_id", code="batch_not_found")
    return row


def _line_states(conn: Connection, batch_id: str) -> dict[str, int]:
    rows = conn.execute(select(batch_lines.c.state, func.count()).where(batch_lines.c.batch_id == batch_id)
                        .group_by(batch_lines.c.state))
    return {state: count for state, count in rows}


def _request_counts(conn: Connection, batch_id: str) -> dict:
    c = batch_lines.c
    succeeded = and_(c.state == "done", c.status_code >= 200, c.status_code < 300)
    finished = c.state.in_(("done", "skipped"))
    total, completed, ended = conn.execute(
        select(func.count(), func.coalesce(func.sum(case((succeeded, 1), else_=0)), 0),
               func.coalesce(func.sum(case((finished, 1), else_=0)), 0))
        .where(c.batch_id == batch_id)).one()
    return {"total": total, "completed": completed, "failed": ended - completed}


def _batch_json(conn: Connection, row) -> dict:
    def stamp(value: float | None) -> int | None:
        return int(value) if value is not None else None

    return {
        "id": row.id, "object": "batch", "endpoint": row.endpoint, "errors": None,
        "input_file_id": row.input_file_id, "completion_window": row.completion_window, "status": row.status,
        "output_file_id": row.output_file_id, "error_file_id": row.error_file_id,
        "created_at": stamp(row.created_at), "in_progress_at": stamp(row.in_progress_at),
        "expires_at": stamp(row.expires_at), "finalizing_at": stamp(row.finalizing_at),
        "completed_at": stamp(row.completed_at), "failed_at": None, "expired_at": stamp(row.expired_at),
        "cancelling_at": stamp(row.cancelling_at), "cancelled_at": stamp(row.cancelled_at),
        "request_counts": _request_counts(conn, row.id),
        "metadata": json.loads(row.metadata_json) if row.metadata_json else None,
    }


def _ready_to_finalize(batch, states: dict[str, int], now: float) -> bool:
    """Active, nothing running, and nothing left to run: all done, cancelling, or expired."""
    if batch.status not in ACTIVE or states.get("running", 0):
        return False
    return states.get("pending", 0) == 0 or batch.status == "cancelling" or batch.expires_at <= now


def _final_status(batch, states: dict[str, int]) -> str:
    if batch.status == "cancelling":
        return "cancelled"
    return "expired" if states.get("pending", 0) else "completed"


def _result_file_ids(batch_id: str) -> tuple[str, str]:
    # Fixed by the batch id, so finalizing again after a crash rewrites the same files.
    suffix = batch_id.removeprefix("batch_")
    return f"file-{suffix}-output", f"file-{suffix}-errors"


def _output_line_id(batch_id: str, line_no: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line_no}"


def _skipped_error(status: str) -> dict:
    if status == "expired":
        return {"code": "batch_expired",
                "message": "This request could not be executed before the completion window expired."}
    return {"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."}


def _output_line(batch_id: str, line, skipped_error: dict) -> dict:
    """One line of an output or error file, in OpenAI's format."""
    line_id = _output_line_id(batch_id, line.line_no)
    if line.state == "skipped":
        return {"id": line_id, "custom_id": line.custom_id, "response": None, "error": skipped_error}
    response = {"status_code": line.status_code, "request_id": line.request_id,
                "body": json.loads(line.response_json)}
    return {"id": line_id, "custom_id": line.custom_id, "response": response, "error": None}
