"""A store of traces: WAL segments, sealed Parquet partitions, the rewards log.

Layout under root (a local directory):
    wal/<segment>.wal                         acknowledged records not yet sealed
    traces/date=YYYY-MM-DD/model=<quoted>/policy_version=<n>/<segment>.parquet
    rewards/<log>.wal                         the append-only rewards side table
Every directory is 0700 and every file 0600: they hold every team's prompts.

The sealed files may live elsewhere instead of root/traces: another directory, or an S3-compatible object store
(settings.sealed_uri; trace_pipeline/sealed.py). The same partitions and names go under that root; every read
and write of sealed files goes through `self.sealed`, the same code for both.

Life of a record: appended to a WAL segment and fsync'ed (acknowledged), later
sealed: written to Parquet files named after its segment (atomic rename), and
only then is the segment deleted. Recovery seals segments whose writer died.
Sealing a segment twice rewrites the same files, so a crash between the rename
and the delete duplicates nothing.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trace_pipeline import codec
from trace_pipeline.records import RewardRecord, TraceRecord
from trace_pipeline.sealed import SealedFiles
from trace_pipeline.settings import S3Settings, TraceSettings
from trace_pipeline.tables import TRACE_SCHEMA, make_dirs_durably, records_to_table
from trace_pipeline.wal import PRIVATE_DIR, SUFFIX, WalSegment, fsync_dir, read_frames

log = logging.getLogger(__name__)


def utc_date(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.timezone.utc).strftime("%Y-%m-%d")


def partition_path(record: TraceRecord) -> str:
    return (f"date={utc_date(record.created_at)}/model={quote(record.model, safe='')}"
            f"/policy_version={record.policy_version}")


def unique_name(prefix: str) -> str:
    return f"{prefix}-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class TraceStore:
    def __init__(self, root: Path | str, zstd_level: int = 3, *, sealed_uri: str | None = None,
                 s3: S3Settings | None = None):
        """root: the local directory of the WAL and the rewards log; sealed_uri: where sealed files go (None:
        root/traces; an absolute directory; s3://bucket/prefix, reached as s3 says)."""
        self.root = Path(root)
        self.wal_dir = self.root / "wal"
        self.rewards_dir = self.root / "rewards"
        for directory in (self.wal_dir, self.rewards_dir):
            make_dirs_durably(directory)
        for directory in (self.root, self.wal_dir, self.rewards_dir):
            directory.chmod(PRIVATE_DIR)   # also a store made before files were private
        self.sealed = SealedFiles.open(sealed_uri or self.root / "traces", s3)
        self.zstd_level = zstd_level
        self._owners = OwnerIndex()
        self._rewards_log: WalSegment | None = None
        self._rewards_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: TraceSettings, root: Path | str | None = None) -> TraceStore:
        """The store these settings describe (root: instead of settings.dir)."""
        return cls(settings.dir if root is None else root, settings.zstd_level,
                   sealed_uri=settings.sealed_uri, s3=settings.s3)

    # ---- writing ---------------------------------------------------------------

    def new_segment(self, prefix: str = "seg") -> WalSegment:
        """Opens a locked WAL segment. It gets its final *.wal name only once locked,
        so recovery in another process can never mistake it for a dead one."""
        name = unique_name(prefix)
        segment = WalSegment(self.wal_dir / f"{name}.opening")
        final = self.wal_dir / f"{name}{SUFFIX}"
        os.replace(segment.path, final)
        fsync_dir(self.wal_dir)
        segment.path = final
        return segment

    def seal(self, segment_path: Path, records: list[TraceRecord]) -> int:
        """Writes the segment's records as Parquet (one file per partition), then deletes
        the segment. Returns the number of records sealed. When a file cannot be written (an object store
        that is down) this raises and the segment stays, for a retry."""
        by_partition: dict[str, list[TraceRecord]] = defaultdict(list)
        for record in records:
            by_partition[partition_path(record)].append(record)
        for partition, group in by_partition.items():
            path = self.sealed.path_of(partition, f"{segment_path.stem}.parquet")
            self.sealed.write(records_to_table(group), path, self.zstd_level)
        segment_path.unlink(missing_ok=True)
        fsync_dir(self.wal_dir)
        log.info("sealed %d records from %s into %d parquet file(s) in %s",
                 len(records), segment_path.name, len(by_partition), self.sealed.uri)
        return len(records)

    def recover(self) -> int:
        """Seals every WAL segment whose writer is gone. Safe while other processes write."""
        recovered = 0
        for path in self.wal_dir.glob("*.opening"):   # created, never renamed, never written
            claim = claim_dead_segment(path)
            if claim is not None:
                path.unlink(missing_ok=True)
                os.close(claim)
        for path in sorted(self.wal_dir.glob(f"*{SUFFIX}")):
            claim = claim_dead_segment(path)
            if claim is None:
                continue
            try:
                records = [codec.decode_trace(p) for p in read_frames(path)]
                recovered += self.seal(path, records)
            finally:
                os.close(claim)
        if recovered:
            log.info("recovery: sealed %d acknowledged records left in the WAL of %s",
                     recovered, self.root)
        return recovered

    def seal_wal_file(self, path: Path) -> int:
        """Seals a closed segment of this process (read back from disk)."""
        return self.seal(path, [codec.decode_trace(p) for p in read_frames(path)])

    # ---- reading ---------------------------------------------------------------

    def sealed_files(self, *, since: float | None = None, until: float | None = None,
                     model: str | None = None, policy_version: int | None = None) -> list[pafs.FileInfo]:
        """Sealed files (path in self.sealed.fs, size) whose partition can hold matching records (pruned by
        path)."""
        first_day = utc_date(since) if since is not None else None
        last_day = utc_date(until) if until is not None else None
        files = []
        for info in self.sealed.list():
            parts = self.sealed.relative(info.path).split("/")
            if len(parts) != 4 or not parts[0].startswith("date=") or not parts[1].startswith("model="):
                continue   # not a partition file of this store
            day, quoted_model, version = parts[0].removeprefix("date="), parts[1].removeprefix("model="), parts[2]
            if first_day and day < first_day or last_day and day > last_day:
                continue
            if model is not None and unquote(quoted_model) != model:
                continue
            if policy_version is not None and version != f"policy_version={policy_version}":
                continue
            files.append(info)
        return files

    def read_table(self, team: str, *, since: float | None = None, until: float | None = None,
                   model: str | None = None, policy_version: int | None = None,
                   session_id: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """All sealed records of one team matching the filters (time range is [since, until))."""
        files = self.sealed_files(since=since, until=until, model=model, policy_version=policy_version)
        if not files:
            return TRACE_SCHEMA.empty_table().select(columns or TRACE_SCHEMA.names)
        condition = pc.field("team") == team
        if since is not None:
            condition &= pc.field("created_at") >= since
        if until is not None:
            condition &= pc.field("created_at") < until
        if session_id is not None:
            condition &= pc.field("session_id") == session_id
        dataset = self.sealed.dataset([f.path for f in files], TRACE_SCHEMA)
        return dataset.to_table(columns=columns, filter=condition)

    # ---- ownership (which team a request or session belongs to) -----------------

    def teams_of_request(self, request_id: str) -> set[str]:
        return self._owners.lookup(self, "request", request_id)

    def teams_of_session(self, session_id: str) -> set[str]:
        return self._owners.lookup(self, "session", session_id)

    def choices_of_request(self, request_id: str) -> set[int]:
        """The choice indexes traced for a request (0 .. n-1)."""
        return self._owners.choices(self, request_id)

    # ---- rewards side table --------------------------------------------------------

    def append_rewards(self, rewards: list[RewardRecord]) -> None:
        """Appends and fsyncs: durable on return."""
        with self._rewards_lock:
            if self._rewards_log is None:
                self._rewards_log = WalSegment(self.rewards_dir / f"{unique_name('rewards')}{SUFFIX}")
            self._rewards_log.append([codec.encode(r) for r in rewards])

    def rotate_rewards_log(self) -> None:
        """Closes this process's rewards log (the next append opens a new one), so that it can be rewritten."""
        with self._rewards_lock:
            if self._rewards_log is not None:
                self._rewards_log.close()
                self._rewards_log = None

    def read_rewards(self, team: str | None = None) -> list[RewardRecord]:
        """Every reward row (of one team), oldest first."""
        rows = [codec.decode_reward(p)
                for path in sorted(self.rewards_dir.glob(f"*{SUFFIX}"))
                for p in read_frames(path)]
        rows.sort(key=lambda r: r.created_at)
        return [r for r in rows if team is None or r.team == team]

    def close(self) -> None:
        self.rotate_rewards_log()


def claim_dead_segment(path: Path) -> int | None:
    """Locks a segment whose writer is gone; None if a live writer holds it (or it vanished)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


class OwnerIndex:
    """request_id / session_id -> teams, and request_id -> choice indexes, built from sealed files and live WAL
    segments.

    Sealed files never change, so each is read once (four columns). WAL segments are
    re-read on a miss: they hold records acknowledged but not yet sealed.
    """

    def __init__(self):
        self._teams = {"request": defaultdict(set), "session": defaultdict(set)}
        self._choices: dict[str, set[int]] = defaultdict(set)
        self._indexed_files: set[str] = set()
        self._lock = threading.Lock()

    def lookup(self, store: TraceStore, kind: str, key: str) -> set[str]:
        with self._lock:
            if key not in self._teams[kind]:
                self._refresh(store)
            return set(self._teams[kind].get(key, ()))

    def choices(self, store: TraceStore, request_id: str) -> set[int]:
        with self._lock:
            if request_id not in self._choices:
                self._refresh(store)
            return set(self._choices.get(request_id, ()))

    def _add(self, request_id: str, session_id: str, team: str, choice_index: int) -> None:
        self._teams["request"][request_id].add(team)
        self._teams["session"][session_id].add(team)
        self._choices[request_id].add(choice_index)

    def _refresh(self, store: TraceStore) -> None:
        # WAL before Parquet: a segment sealed in between is then found in Parquet.
        for path in store.wal_dir.glob(f"*{SUFFIX}"):
            try:
                for payload in read_frames(path):
                    owner = codec.decode_owner(payload)
                    self._add(owner.request_id, owner.session_id, owner.team, owner.choice_index)
            except FileNotFoundError:
                continue
        for info in store.sealed_files():
            if info.path in self._indexed_files:
                continue
            table = store.sealed.read(info.path, columns=["request_id", "session_id", "team", "choice_index"])
            for request_id, session_id, team, choice_index in zip(*(table[c].to_pylist() for c in table.column_names)):
                self._add(request_id, session_id, team, choice_index)
            self._indexed_files.add(info.path)
