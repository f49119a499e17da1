"""API keys mapped to teams, stored hashed (SQLite by default, Postgres by URL).

With no key in the database the service runs in open local mode: every request is
team "local" and a warning says so at start-up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Boolean, Column, Float, MetaData, String, Table, create_engine, func, select, update
from sqlalchemy.engine import Engine

from rollout_server.errors import APIError
from rollout_server.read_cache import ReadCache

log = logging.getLogger(__name__)

OPEN_MODE_TEAM = "local"
KEY_PREFIX = "rs-"

_metadata = MetaData()
api_keys = Table(
    "api_keys", _metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("key_prefix", String(16), nullable=False),
    Column("team", String(128), nullable=False, index=True),
    Column("name", String(128), nullable=True),
    Column("is_admin", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("revoked", Boolean, nullable=False, default=False),
)


@dataclass(frozen=True)
class Principal:
    team: str
    key_prefix: str | None
    is_admin: bool


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def open_database(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        from pathlib import Path

        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, future=True)
    _metadata.create_all(engine)
    return engine


class KeyStore:
    def __init__(self, engine: Engine, admin_key: str | None = None):
        self.engine = engine
        self.admin_key_hash = hash_key(admin_key) if admin_key else None

    def create(self, team: str, name: str | None = None, is_admin: bool = False) -> str:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(api_keys.insert().values(
                key_hash=hash_key(key), key_prefix=key[:10], team=team, name=name, is_admin=is_admin,
                created_at=time.time(), revoked=False))
        return key

    def revoke(self, key_prefix: str) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(update(api_keys).where(api_keys.c.key_prefix == key_prefix).values(revoked=True))
        return result.rowcount

    def list(self, team: str | None = None) -> list[dict]:
        query = select(api_keys.c.key_prefix, api_keys.c.team, api_keys.c.name, api_keys.c.is_admin,
                       api_keys.c.created_at, api_keys.c.revoked)
        if team:
            query = query.where(api_keys.c.team == team)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query.order_by(api_keys.c.created_at))]

    def has_keys(self) -> bool:
        with self.engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(api_keys).where(api_keys.c.revoked.is_(False))).scalar()
        return bool(count) or self.admin_key_hash is not None

    def lookup(self, key: str) -> Principal | None:
        """The key's principal, None for an unknown or revoked key (a database read)."""
        digest = hash_key(key)
        if digest == self.admin_key_hash:
            return Principal(team="admin", key_prefix=key[:10], is_admin=True)
        with self.engine.connect() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.key_hash == digest)).first()
        return Principal(row.team, row.key_prefix, row.is_admin) if row is not None and not row.revoked else None


class Authenticator:
    """Resolves `Authorization: Bearer <key>` to a team, or the open-mode principal when no key exists.

    What the server read of a key (or of whether any key exists) is trusted for `recheck_s`, then read again
    in a worker thread (rollout_server/read_cache.py): a key created or revoked with `rollout-serve keys`, or
    the first key that ends open mode, takes effect within that delay.
    """

    def __init__(self, store: KeyStore, recheck_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.recheck_s = recheck_s
        self.clock = clock
        self.open_mode = not store.has_keys()
        self._open_mode_read_at = clock()
        # key hash -> principal; unknown keys are not kept: a stream of made-up keys cannot fill memory
        self._principals: ReadCache[str, Principal | None] = ReadCache(recheck_s, keep=lambda p: p is not None,
                                                                       clock=clock)
        if self.open_mode:
            log.warning("!!! NO API KEYS CONFIGURED: open local mode, every request is accepted as team '%s'. "
                        "Create keys with `rollout-serve keys create --team NAME` !!!", OPEN_MODE_TEAM)

    async def authenticate(self, authorization: str | None) -> Principal:
        if self.open_mode and self.clock() - self._open_mode_read_at >= self.recheck_s:
            await self._read_open_mode()
        if self.open_mode:
            return Principal(OPEN_MODE_TEAM, None, is_admin=True)
        if not authorization or not authorization.lower().startswith("bearer "):
            raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
        key = authorization[7:].strip()
        principal = await self._principals.get(hash_key(key), lambda: self.store.lookup(key))
        if principal is None:
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return principal

    async def _read_open_mode(self) -> None:
        self._open_mode_read_at = self.clock()  # one read for the requests arriving meanwhile
        self.open_mode = not await asyncio.to_thread(self.store.has_keys)
        if not self.open_mode:
            log.info("API keys exist now: open local mode is over, requests need a key")
