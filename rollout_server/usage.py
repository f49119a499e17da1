"""Usage accounting: what each team and key used, per model and pool, over time.

Every finished request is added to an in-memory aggregate keyed by (minute, team,
key prefix, model, pool): `UsageRecorder.record()` is a dict update, cheap enough
for the event loop. A writer thread inserts the aggregates every `flush_every_s`
seconds, and `close()` inserts what is left, so a clean shutdown loses nothing; a
killed process loses at most the last interval. Rows are only ever inserted (two
rows for the same minute simply add up when queried), which keeps the SQL portable
between SQLite and PostgreSQL (rollout_server/database.py).

Time has minute resolution: a request counts in the minute it was created in.

    store = UsageStore(open_database(url))
    recorder = UsageRecorder(store); recorder.start()
    ctx.on_finish.append(recorder.on_finish)
    app.include_router(usage_router(store, principal))   # GET /v1/usage (rollout_server/routes/usage.py)
    ...
    recorder.close()
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import asdict, dataclass, fields

from sqlalchemy import BigInteger, Column, Float, Index, Integer, MetaData, String, Table, cast, func, select
from sqlalchemy.engine import Engine

from rollout_server.serving.finished import FinishedGeneration

log = logging.getLogger(__name__)

GROUP_BY_FIELDS = ("team", "key", "model", "pool", "day")
SECONDS_PER_DAY = 86400


_metadata = MetaData()
usage_minutes = Table(
    "usage_minutes", _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("minute", BigInteger, nullable=False),          # unix seconds at the start of the minute
    Column("team", String(128), nullable=False),
    Column("key_prefix", String(16), nullable=True),       # None: open local mode (no key)
    Column("model", String(256), nullable=False),
    Column("pool", String(128), nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("cached_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("wall_s", Float, nullable=False),
    Index("ix_usage_minutes_team_minute", "team", "minute"),
    Index("ix_usage_minutes_minute", "minute"),
)


# ---- data ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class UsageEvent:
    """One finished request, as usage sees it."""

    team: str
    key_prefix: str | None
    model: str
    pool: str
    created_at: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    wall_s: float


@dataclass(frozen=True)
class UsageKey:
    minute: int
    team: str
    key_prefix: str | None
    model: str
    pool: str


@dataclass
class UsageCounts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0

    def add(self, other: UsageCounts) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.completion_tokens += other.completion_tokens
        self.wall_s += other.wall_s

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class UsageQuery:
    team: str | None = None          # None: every team (admins only, enforced by the router)
    key_prefix: str | None = None
    model: str | None = None
    since: float | None = None       # unix seconds, inclusive (minute resolution)
    until: float | None = None       # unix seconds, exclusive
    group_by: tuple[str, ...] = ()   # fields of GROUP_BY_FIELDS; () gives one total


@dataclass(frozen=True)
class UsageRow:
    group: dict[str, str | None]     # the group_by fields of this row ("day" as YYYY-MM-DD, UTC)
    counts: UsageCounts

    def to_json(self) -> dict:
        return {**self.group, **asdict(self.counts), "total_tokens": self.counts.total_tokens}


def minute_of(unix_s: float) -> int:
    return int(unix_s // 60) * 60


def usage_event(generation: FinishedGeneration) -> UsageEvent:
    return UsageEvent(
        team=generation.team, key_prefix=generation.key_prefix, model=generation.model,
        pool=generation.pool, created_at=generation.created_at,
        prompt_tokens=generation.prompt_tokens, cached_tokens=generation.cached_tokens,
        completion_tokens=generation.completion_tokens, wall_s=generation.total_s,
    )


# ---- storage -------------------------------------------------------------------------------

class UsageStore:
    """The usage table: insert aggregated minutes, query totals."""

    def __init__(self, engine: Engine):
        self.engine = engine
        _metadata.create_all(engine)

    def add(self, minutes: dict[UsageKey, UsageCounts]) -> None:
        rows = [{**asdict(key), **asdict(counts)} for key, counts in minutes.items()]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(usage_minutes.insert(), rows)

    def totals(self, query: UsageQuery) -> list[UsageRow]:
        group_columns = [_group_column(name) for name in query.group_by]
        sums = [_sum(usage_minutes.c[f.name]).label(f.name) for f in fields(UsageCounts)]
        statement = select(*group_columns, *sums).where(*_filters(query))
        if group_columns:
            statement = statement.group_by(*group_columns).order_by(*group_columns)
        with self.engine.connect() as conn:
            result = conn.execute(statement).all()
        return [_usage_row(query.group_by, row._mapping) for row in result
                if group_columns or row._mapping["requests"]]


def _sum(column):
    """The column's sum (0 over no rows), of the column's type: PostgreSQL sums bigints as numerics (Decimal)."""
    return cast(func.coalesce(func.sum(column), 0), column.type)


def _group_column(name: str):
    if name == "day":
        return ((usage_minutes.c.minute // SECONDS_PER_DAY) * SECONDS_PER_DAY).label("day")
    if name == "key":
        return usage_minutes.c.key_prefix.label("key")
    return usage_minutes.c[name]


def _filters(query: UsageQuery) -> list:
    c = usage_minutes.c
    conditions = []
    if query.team is not None:
        conditions.append(c.team == query.team)
    if query.key_prefix is not None:
        conditions.append(c.key_prefix == query.key_prefix)
    if query.model is not None:
        conditions.append(c.model == query.model)
    if query.since is not None:
        conditions.append(c.minute >= minute_of(query.since))
    if query.until is not None:
        conditions.append(c.minute < query.until)
    return conditions


def _usage_row(group_by: tuple[str, ...], mapping) -> UsageRow:
    group = {name: mapping[name] for name in group_by}
    if "day" in group:
        group["day"] = dt.datetime.fromtimestamp(group["day"], dt.timezone.utc).date().isoformat()
    counts = UsageCounts(**{f.name: mapping[f.name] for f in fields(UsageCounts)})
    counts.wall_s = float(counts.wall_s)
    return UsageRow(group, counts)


# ---- recording -----------------------------------------------------------------------------

class UsageRecorder:
    """Aggregates finished requests in memory; a writer thread inserts them into the store."""

    def __init__(self, store: UsageStore, flush_every_s: float = 1.0):
        self.store = store
        self.flush_every_s = flush_every_s
        self._pending: dict[UsageKey, UsageCounts] = {}
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()   # one insert at a time: the writer thread or a caller of flush()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._write_periodically, name="usage-writer", daemon=True)
        self._thread.start()

    def record(self, event: UsageEvent) -> None:
        key = UsageKey(minute_of(event.created_at), event.team, event.key_prefix, event.model, event.pool)
        counts = UsageCounts(1, event.prompt_tokens, event.cached_tokens, event.completion_tokens, event.wall_s)
        with self._pending_lock:
            self._pending.setdefault(key, UsageCounts()).add(counts)

    async def on_finish(self, generation: FinishedGeneration) -> None:
        """A `ServingContext.on_finish` hook."""
        self.record(usage_event(generation))

    def flush(self) -> int:
        """Inserts everything recorded so far; returns the number of rows written. On a database
        error the counts go back to the pending aggregate (retried at the next flush) and it raises."""
        with self._flush_lock:
            with self._pending_lock:
                batch, self._pending = self._pending, {}
            try:
                self.store.add(batch)
            except Exception:
                self._restore(batch)
                raise
            return len(batch)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def _restore(self, batch: dict[UsageKey, UsageCounts]) -> None:
        with self._pending_lock:
            for key, counts in batch.items():
                self._pending.setdefault(key, UsageCounts()).add(counts)

    def _write_periodically(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            try:
                self.flush()
            except Exception:
                log.exception("writing usage failed; the counts are kept and retried")


# ---- query parameters (shared by the API and the CLI) ---------------------------------------

def parse_group_by(values: list[str]) -> tuple[str, ...]:
    """["team,model", "day"] -> ("team", "model", "day"); unknown names raise ValueError."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in GROUP_BY_FIELDS]
    if unknown:
        raise ValueError(f"cannot group by {unknown[0]!r}; choose from {', '.join(GROUP_BY_FIELDS)}")
    return tuple(dict.fromkeys(names))
