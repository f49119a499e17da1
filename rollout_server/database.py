"""Opening the state databases: keys, usage, rate limits and the deploy registry in one, batch records in another
(`--database-url`, `--batches-database-url`), on SQLite or PostgreSQL.

The rule: a URL names SQLite (`sqlite:///path`, the default; its directory is made on first use) or PostgreSQL
(`postgresql://user:password@host:port/name`, or `postgresql+psycopg://...`: both go through psycopg 3, and a Unix
socket is `?host=/dir`). Any other URL is refused when the settings are read (`check_url`). `open_engine` connects
once before it returns: an unreachable server, a wrong password or a missing database is a `DatabaseError` naming
the URL with its password hidden, said when `rollout-serve up` starts, not at the first request.

The tables and statements are the same on both: SQLAlchemy Core, portable SQL (no upserts: a delete and an insert
in one transaction; sums cast back to integers, as PostgreSQL sums bigints as numerics).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
POSTGRESQL_SCHEMES = ("postgresql", "postgresql+psycopg")
POSTGRESQL_DRIVER = "postgresql+psycopg"
CONNECT_TIMEOUT_S = 10   # an unreachable host is an error at start, not a hang (unless the URL sets its own)


class DatabaseError(RuntimeError):
    """A database that cannot be opened; the message names its URL (password hidden) and why."""


def check_url(url: str) -> str:
    """`url` if it names a database this module opens (module docstring), else ValueError saying which do."""
    scheme = url.partition("://")[0].lower()
    if "://" not in url or scheme not in SQLITE_SCHEMES + POSTGRESQL_SCHEMES:
        raise ValueError(f"unsupported database URL {redacted(url)!r}: use sqlite:///PATH or "
                         "postgresql://USER:PASSWORD@HOST:PORT/NAME (postgresql+psycopg:// is the same)")
    return url


def redacted(url: str) -> str:
    """The URL as it may be shown: its password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("@")[-1] if "@" in url else url   # unparseable: at least drop what precedes a host


def open_engine(url: str, sqlite_wal: bool = False) -> Engine:
    """An engine on the database, checked by one connection (DatabaseError if it cannot be opened).

    `sqlite_wal`: SQLite in WAL mode (readers do not wait for a writer), for a database written all the time.
    """
    check_url(url)
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url, sqlite_wal)
        else:
            timeout = {} if "connect_timeout" in parsed.query else {"connect_timeout": CONNECT_TIMEOUT_S}
            engine = create_engine(parsed.set(drivername=POSTGRESQL_DRIVER), pool_pre_ping=True, connect_args=timeout)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, ImportError, OSError) as exc:
        raise DatabaseError(f"cannot open the database {redacted(url)}: {_reason(exc)}") from exc
    return engine


def _sqlite_engine(url: str, wal: bool) -> Engine:
    path = url.partition(":///")[2]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    if wal:
        event.listen(engine, "connect", _sqlite_wal_pragmas)
    return engine


def _sqlite_wal_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")   # in WAL mode: durable across a process crash, consistent always
    cursor.close()


def _reason(exc: BaseException) -> str:
    """The driver's own words (psycopg: "connection ... failed: Connection refused"), on one line."""
    original = getattr(exc, "orig", None) or exc
    return " ".join(str(original).split()) or type(original).__name__
