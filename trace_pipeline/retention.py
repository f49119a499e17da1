"""Retention: how long, and how much, the trace store keeps of each team (settings.retention_*).

A sweep (TraceCapture runs one at start and every retention_sweep_s; `sweep()` runs one) applies two rules,
to sealed traces and to reward rows alike:
- age: a record whose created_at is older than retention_days is removed;
- bytes per team: a team holding more than retention_bytes_per_team loses its oldest records until it
  holds no more; other teams' records are never touched.

A team's trace bytes are its rows' share of each Parquet file (file size x its rows / the file's rows):
files mix teams, so that is the fair split of what is stored (on disk, or in the object store of
settings.sealed_uri: the sweep reads, rewrites and deletes sealed files through store.sealed, either way). Its reward bytes are its rows' WAL frames.
Traces go one sealed file's worth of the team's rows at a time, oldest file first (by the oldest of its
rows), so a sweep may remove up to one file's worth more than the budget needs; reward rows go one by one.

A file losing rows is rewritten without them (whole, same name: trace_pipeline/sealed.py); a file losing all is
deleted. Records
not yet sealed (still in the WAL) are never removed, nor a sealed file whose segment is still in the WAL
(a crash between sealing and deleting the segment: recovery would write the file again), nor a rewards log
another live process is appending to.
"""
from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from trace_pipeline import codec
from trace_pipeline.sealed import stem
from trace_pipeline.settings import TraceSettings
from trace_pipeline.store import TraceStore, claim_dead_segment
from trace_pipeline.wal import FRAME_HEADER, SUFFIX, read_frames, write_segment_atomically

log = logging.getLogger(__name__)

DAY_S = 86400.0
T = TypeVar("T")


@dataclass
class SweepResult:
    traces_removed: int = 0
    rewards_removed: int = 0
    by_team: dict[str, int] = field(default_factory=lambda: defaultdict(int))   # records and rows removed


def sweep(store: TraceStore, settings: TraceSettings, now: float | None = None) -> SweepResult:
    """Applies the age and bytes-per-team rules to store's sealed traces and reward rows (module doc)."""
    cutoff = age_cutoff(settings.retention_days, now)
    result = SweepResult()
    _sweep_traces(store, cutoff, settings.retention_bytes_per_team, settings.zstd_level, result)
    _sweep_rewards(store, cutoff, settings.retention_bytes_per_team, result)
    if result.traces_removed or result.rewards_removed:
        log.info("retention: removed %d trace records and %d reward rows of %s (older than %s days, over %s "
                 "bytes per team)", result.traces_removed, result.rewards_removed, dict(result.by_team),
                 settings.retention_days, settings.retention_bytes_per_team)
    return result


def age_cutoff(retention_days: float | None, now: float | None = None) -> float | None:
    """The created_at before which a record is too old to keep; None when records are kept forever."""
    if retention_days is None:
        return None
    return (time.time() if now is None else now) - retention_days * DAY_S


def oldest_beyond_budget(items: Iterable[T], size: Callable[[T], float], created_at: Callable[[T], float],
                         budget: int) -> list[T]:
    """The oldest of one team's items to remove, oldest first, so that what it keeps totals at most budget."""
    items = list(items)
    usage = sum(size(item) for item in items)
    removed = []
    for item in sorted(items, key=created_at):
        if usage <= budget:
            break
        usage -= size(item)
        removed.append(item)
    return removed


# ---- traces ----------------------------------------------------------------------------------------

@dataclass
class _SealedFile:
    path: str   # in store.sealed.fs
    size: int
    teams: list[str]
    created_at: list[float]
    removed: set[int] = field(default_factory=set)   # row numbers to remove

    @property
    def row_bytes(self) -> float:
        """One row's share of the file's size."""
        return self.size / max(1, len(self.teams))

    def kept_rows(self, team: str) -> list[int]:
        return [i for i, t in enumerate(self.teams) if t == team and i not in self.removed]


def _sweep_traces(store: TraceStore, cutoff: float | None, budget: int | None, zstd_level: int,
                  result: SweepResult) -> None:
    files = [_read_sealed(store, info) for info in store.sealed_files() if not _segment_still_in_wal(store, info)]
    if cutoff is not None:
        for f in files:
            f.removed.update(i for i, created in enumerate(f.created_at) if created < cutoff)
    if budget is not None:
        for team in {team for f in files for team in f.teams}:
            _trim_team(files, team, budget)
    for f in files:
        if f.removed:
            _rewrite_without(store, f, zstd_level, result)


def _read_sealed(store: TraceStore, info: pafs.FileInfo) -> _SealedFile:
    table = store.sealed.read(info.path, columns=["team", "created_at"])
    return _SealedFile(info.path, info.size, table["team"].to_pylist(), table["created_at"].to_pylist())


def _segment_still_in_wal(store: TraceStore, info: pafs.FileInfo) -> bool:
    return (store.wal_dir / f"{stem(info.path)}{SUFFIX}").exists()


def _trim_team(files: list[_SealedFile], team: str, budget: int) -> None:
    """Marks the team's rows for removal, oldest file first, until what it keeps fits its budget."""
    held = [(f, rows) for f in files if (rows := f.kept_rows(team))]
    for f, rows in oldest_beyond_budget(held, lambda held_file: held_file[0].row_bytes * len(held_file[1]),
                                        lambda held_file: min(held_file[0].created_at[i] for i in held_file[1]),
                                        budget):
        f.removed.update(rows)


def _rewrite_without(store: TraceStore, f: _SealedFile, zstd_level: int, result: SweepResult) -> None:
    for i in f.removed:
        result.by_team[f.teams[i]] += 1
    result.traces_removed += len(f.removed)
    if len(f.removed) == len(f.teams):
        store.sealed.delete(f.path)
        return
    table = store.sealed.read(f.path)
    keep = pa.array([i not in f.removed for i in range(table.num_rows)])
    store.sealed.write(table.filter(keep), f.path, zstd_level)


# ---- rewards ---------------------------------------------------------------------------------------

@dataclass
class _RewardRow:
    path: Path
    payload: bytes
    team: str
    created_at: float

    @property
    def bytes(self) -> int:
        return FRAME_HEADER.size + len(self.payload)


def _sweep_rewards(store: TraceStore, cutoff: float | None, budget: int | None, result: SweepResult) -> None:
    store.rotate_rewards_log()   # this process's log becomes claimable like any finished one
    claims = {}
    try:
        for path in sorted(store.rewards_dir.glob(f"*{SUFFIX}")):
            claim = claim_dead_segment(path)   # a log another process is appending to is left alone
            if claim is not None:
                claims[path] = claim
        rows = [_RewardRow(path, payload, (row := codec.decode_reward(payload)).team, row.created_at)
                for path in claims for payload in read_frames(path)]
        removed = {i for i, row in enumerate(rows) if cutoff is not None and row.created_at < cutoff}
        if budget is not None:
            by_team: dict[str, list[int]] = defaultdict(list)
            for i, row in enumerate(rows):
                if i not in removed:
                    by_team[row.team].append(i)
            for indexes in by_team.values():
                removed.update(oldest_beyond_budget(indexes, lambda i: rows[i].bytes, lambda i: rows[i].created_at,
                                                    budget))
        for path in claims:
            lost = [row for i, row in enumerate(rows) if row.path == path and i in removed]
            if not lost:
                continue
            kept = [row.payload for i, row in enumerate(rows) if row.path == path and i not in removed]
            for row in lost:
                result.by_team[row.team] += 1
            result.rewards_removed += len(lost)
            if kept:
                write_segment_atomically(path, kept)
            else:
                path.unlink(missing_ok=True)
    finally:
        for claim in claims.values():
            os.close(claim)
