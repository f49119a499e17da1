"""API keys mapped to teams, stored hashed (SQLite by default, PostgreSQL by URL: rollout_server/database.py).

Every request needs a key, except in open mode, an explicit setting (`server.open_mode`, `--open-mode`) that is
off by default. In open mode a caller on loopback without a valid key is the local admin (team "local"), a caller
with a valid key is that key's principal, and any other caller needs a key as always; `rollout-serve up` refuses
open mode with a host other than loopback. Nothing else opens the service: no key in the database, every key
revoked, or a database_url naming an empty database leave it closed, each request a 401 saying how to make a key.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Boolean, Column, Float, MetaData, String, Table, func, select, update
from sqlalchemy.engine import Engine

from rollout_server.database import open_engine
from rollout_server.errors import APIError
from rollout_server.read_cache import ReadCache

log = logging.getLogger(__name__)

OPEN_MODE_TEAM = "local"
KEY_PREFIX = "rs-"
MAX_TEAM_CHARS = 128

_metadata = MetaData()
api_keys = Table(
    "api_keys", _metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("key_prefix", String(16), nullable=False),
    Column("team", String(MAX_TEAM_CHARS), nullable=False, index=True),
    Column("name", String(MAX_TEAM_CHARS), nullable=True),
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
    """The state database (keys, usage, rate limits, the deploy registry), with the keys table made if missing;
    DatabaseError if it cannot be opened."""
    engine = open_engine(url)
    _metadata.create_all(engine)
    return engine


class KeyStore:
    def __init__(self, engine: Engine, admin_key: str | None = None):
        self.engine = engine
        self.admin_key_hash = hash_key(admin_key) if admin_key else None

    def create(self, team: str, name: str | None = None, is_admin: bool = False) -> str:
        """A new key for `team` (ValueError for a team name no database could store), returned once."""
        if not team or len(team) > MAX_TEAM_CHARS or "\x00" in team:
            raise ValueError(f"a team name is 1 to {MAX_TEAM_CHARS} characters, without NUL characters")
        if name is not None and (len(name) > MAX_TEAM_CHARS or "\x00" in name):
            raise ValueError(f"a key's name is at most {MAX_TEAM_CHARS} characters, without NUL characters")
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

    def could_be_key(self, key: str) -> bool:
        """Whether `key` has the form of a key this store holds: one it made (KEY_PREFIX), or the admin key.
        Anything else is answered without a database read (openai clients in open mode send a placeholder)."""
        return key.startswith(KEY_PREFIX) or hash_key(key) == self.admin_key_hash

    def lookup(self, key: str) -> Principal | None:
        """The key's principal, None for an unknown or revoked key (a database read)."""
        digest = hash_key(key)
        if digest == self.admin_key_hash:
            return Principal(team="admin", key_prefix=key[:10], is_admin=True)
        with self.engine.connect() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.key_hash == digest)).first()
        return Principal(row.team, row.key_prefix, row.is_admin) if row is not None and not row.revoked else None


OPEN_MODE_PRINCIPAL = Principal(OPEN_MODE_TEAM, None, is_admin=True)
_HOW_TO_GET_A_KEY = ("Keys are made with `rollout-serve keys create --team NAME`; a server started with --open-mode "
                     "serves callers on loopback without one.")


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an IP address, or "localhost") is this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:  # a name, or no address at all (a client over a Unix socket)
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as a dual-stack socket reports it
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class Authenticator:
    """Resolves `Authorization: Bearer <key>` and the client's address to a principal (module docstring).

    What the server read of a key is trusted for `recheck_s`, then read again in a worker thread
    (rollout_server/read_cache.py): a key created or revoked with `rollout-serve keys` takes effect within that
    delay.
    """

    def __init__(self, store: KeyStore, recheck_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 open_mode: bool = False):
        self.store = store
        self.recheck_s = recheck_s
        self.open_mode = open_mode
        # key hash -> principal; unknown keys are not kept: a stream of made-up keys cannot fill memory
        self._principals: ReadCache[str, Principal | None] = ReadCache(recheck_s, keep=lambda p: p is not None,
                                                                       clock=clock)
        if open_mode:
            log.warning("open mode (--open-mode): callers on loopback without a key are accepted as team '%s', "
                        "with admin rights; every other caller needs a key", OPEN_MODE_TEAM)
        elif not store.has_keys():
            log.warning("!!! NO API KEY EXISTS and open mode is off: every request is refused (401) until one is "
                        "made with `rollout-serve keys create --team NAME` (or start with --open-mode to serve "
                        "callers on loopback without a key) !!!")

    async def authenticate(self, authorization: str | None, client_host: str | None = None) -> Principal:
        """The principal of the request's key, else, in open mode and from loopback, the local admin."""
        key = authorization[7:].strip() if authorization and authorization.lower().startswith("bearer ") else None
        principal = None
        if key and self.store.could_be_key(key):
            principal = await self._principals.get(hash_key(key), lambda: self.store.lookup(key))
        if principal is not None:
            return principal
        if self.open_mode and is_loopback(client_host):
            return OPEN_MODE_PRINCIPAL  # any key that is not one (openai clients must send one) counts as none
        if key is None:
            where = " (open mode serves callers on loopback only)" if self.open_mode else ""
            raise APIError(401, f"Missing API key{where}: send 'Authorization: Bearer <key>'. {_HOW_TO_GET_A_KEY}",
                           code="missing_api_key")
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
