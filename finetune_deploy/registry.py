"""The checkpoint registry: numbered policy versions per pool, their status and deploy history, in SQL (the
state database, SQLite or PostgreSQL: the engine it is given).

Each pool starts from its base model, version 0. Every registered checkpoint
gets the next number, never reused: versions only grow, even after a rollback.
A rollback re-activates an older version, so the served version number goes
back to that older number (RL rollouts are then tagged with the policy that
really produced them); the next checkpoint still gets max + 1.

A pool serves one full-weights version (its policy, `current`) and, beside it,
at most one version of each named LoRA adapter (`serving_adapters`: the base
weights plus that adapter, under the adapter's own model id). Status moves
registered -> deploying -> serving | failed; a serving version becomes retired
when another one of its track (full weights, or the same adapter name) finishes
deploying, or an adapter is unloaded; a retired or failed one may deploy again.
Every change is an event with a message, and the events decide `previous`:
the activation history of the full-weights track is a stack; a finished deploy
pushes its version, a rollback pops the version it leaves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, String, Table, Text, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from engine.ids import BASE_VERSION, PolicyVersion
from finetune_deploy.checkpoint_files import FileState
from finetune_deploy.checkpoints import fingerprint_base_model, validate_checkpoint, verify_unchanged

STATUSES = ("registered", "deploying", "serving", "retired", "failed")
# "serving" has no way out here: only another version's finished deploy retires it.
ALLOWED_TRANSITIONS = {
    "registered": {"deploying", "retired", "failed"},
    "deploying": {"serving", "failed"},
    "serving": set(),
    "retired": {"deploying"},
    "failed": {"deploying", "retired"},
}
EVENT_OF_STATUS = {"deploying": "deploy_started", "serving": "deploy_finished", "failed": "deploy_failed",
                   "retired": "retired"}

_metadata = MetaData()
policy_versions = Table(
    "policy_versions", _metadata,
    Column("pool", String(128), primary_key=True),
    Column("version", BigInteger, primary_key=True, autoincrement=False),   # 64 bits: a trainer's step numbers
    Column("name", String(256), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("path", String(4096), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("parent_version", BigInteger, nullable=True),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)
deployment_events = Table(
    "deployment_events", _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pool", String(128), nullable=False, index=True),
    Column("version", BigInteger, nullable=False),
    Column("event", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)


class RegistryError(Exception):
    pass


@dataclass(frozen=True)
class RegisteredVersion:
    """One checkpoint of a pool, as the registry holds it."""

    pool: str
    version: PolicyVersion
    name: str
    kind: str  # "full" | "lora"
    path: str
    fingerprint: str
    parent_version: int | None
    status: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class DeploymentEvent:
    id: int
    pool: str
    version: int
    event: str  # registered | deploy_started | deploy_finished | deploy_failed | retired | rolled_back
    message: str
    created_at: float


class CheckpointRegistry:
    INSERT_RETRIES = 5  # two registrations racing for the same next number: the loser takes the one after

    def __init__(self, engine: Engine):
        self.engine = engine
        _metadata.create_all(engine)
        # (path, fingerprint) -> its files' state when this process last hashed them (checkpoints.verify_unchanged)
        self._file_states: dict[tuple[str, str], dict[str, FileState]] = {}

    def register_base(self, pool: str, path: Path | str, name: str) -> RegisteredVersion:
        """Records the pool's base model as version 0, serving; a second call with the same path is a no-op."""
        path = str(Path(path).resolve())
        existing = self._find(pool, BASE_VERSION)
        if existing is not None:
            if existing.path != path:
                raise RegistryError(f"pool {pool!r} already has base model {existing.path}; a new base is a new pool")
            return existing
        fingerprint, now = fingerprint_base_model(path), time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(policy_versions.insert().values(
                    pool=pool, version=BASE_VERSION, name=name, kind="full", path=path, fingerprint=fingerprint,
                    parent_version=None, status="serving", created_at=now, updated_at=now))
                _add_event(conn, pool, BASE_VERSION, "registered", "base model")
                _add_event(conn, pool, BASE_VERSION, "deploy_finished", "base model serves at start")
        except IntegrityError:
            return self.register_base(pool, path, name)  # another process registered it first
        return self.get(pool, BASE_VERSION)

    def register(self, pool: str, path: Path | str, name: str | None = None, kind: str | None = None,
                 version: int | None = None, parent_version: int | None = None, message: str = "") -> RegisteredVersion:
        """Validates the checkpoint against the pool's base (CheckpointError if unfit), then records it.

        `version` lets an RL trainer use its own step numbers; it must exceed every version the pool ever had.
        `parent_version` defaults to the version serving now (the weights this one was trained from or sits on).
        """
        base = self._find(pool, BASE_VERSION)
        if base is None:
            raise RegistryError(f"pool {pool!r} has no base model: register_base it first")
        checkpoint = validate_checkpoint(path, base.path, kind)
        parent = self.get(pool, parent_version) if parent_version is not None else self._require_current(pool)
        row = dict(pool=pool, name=name or checkpoint.path.name, kind=checkpoint.kind, path=str(checkpoint.path),
                   fingerprint=checkpoint.fingerprint, parent_version=parent.version, status="registered")
        self._file_states[(row["path"], row["fingerprint"])] = checkpoint.files_state
        for _ in range(self.INSERT_RETRIES):
            try:
                return self._insert_version(row, version, message)
            except IntegrityError:
                if version is not None:
                    raise RegistryError(f"version {version} already exists in pool {pool!r}") from None
        raise RegistryError(f"could not allocate a version in pool {pool!r}: too many concurrent registrations")

    def _insert_version(self, row: dict, requested: int | None, message: str) -> RegisteredVersion:
        now = time.time()
        with self.engine.begin() as conn:
            highest = conn.execute(select(func.max(policy_versions.c.version))
                                   .where(policy_versions.c.pool == row["pool"])).scalar()
            if requested is not None and requested <= highest:
                raise RegistryError(f"version {requested} is not above version {highest}, the highest pool "
                                    f"{row['pool']!r} ever had: versions are never reused")
            version = requested if requested is not None else highest + 1
            conn.execute(policy_versions.insert().values(version=version, created_at=now, updated_at=now, **row))
            _add_event(conn, row["pool"], version, "registered", message)
        return self.get(row["pool"], version)

    def verify_unchanged(self, version: RegisteredVersion) -> None:
        """Right before a version loads anywhere: CheckpointChanged if its files are not the ones registered.
        A stat of each file while they are as this process last hashed them; a full hash after a restart."""
        key = (version.path, version.fingerprint)
        self._file_states[key] = verify_unchanged(version.path, version.kind, version.fingerprint,
                                                  self._file_states.get(key))

    def highest_version(self, pool: str) -> PolicyVersion:
        """The highest version the pool ever had: a version registered next must be above it."""
        with self.engine.connect() as conn:
            return conn.execute(select(func.max(policy_versions.c.version))
                                .where(policy_versions.c.pool == pool)).scalar() or BASE_VERSION

    def mark_status(self, pool: str, version: int, status: str, message: str = "") -> RegisteredVersion:
        """Moves a version along its lifecycle; `serving` retires the version that served before."""
        with self.engine.begin() as conn:
            _transition(conn, pool, version, status, message)
        return self.get(pool, version)

    def rollback(self, pool: str, message: str = "", to_version: int | None = None) -> RegisteredVersion:
        """Starts re-activating an older version (default: `previous(pool)`); it is returned, deploying.

        The caller then runs the rollout plan with its path and marks it serving (or failed).
        """
        current = self._require_current(pool)
        target = self.get(pool, to_version) if to_version is not None else self.previous(pool)
        if target is None:
            raise RegistryError(f"pool {pool!r} has no earlier version to roll back to")
        served_before = any(event.event == "deploy_finished" for event in self.events(pool, target.version))
        if target.kind != "full":
            raise RegistryError(f"version {target.version} of pool {pool!r} is a LoRA adapter; roll back the pool's "
                                "weights to a full version, or deploy an older adapter version again")
        if target.status != "retired" or not served_before:
            raise RegistryError(f"version {target.version} of pool {pool!r} is {target.status}; only a version "
                                "that served before and was retired can be rolled back to")
        with self.engine.begin() as conn:
            _transition(conn, pool, target.version, "deploying", f"rollback from version {current.version}")
            _add_event(conn, pool, current.version, "rolled_back",
                       f"rolled back to version {target.version}" + (f": {message}" if message else ""))
        return self.get(pool, target.version)

    def current(self, pool: str) -> RegisteredVersion | None:
        """The full-weights version serving the pool, None for an unknown pool."""
        serving = [v for v in self._serving(pool) if v.kind == "full"]
        return serving[0] if serving else None

    def serving_adapters(self, pool: str) -> list[RegisteredVersion]:
        """The LoRA versions loaded beside the pool's weights, one per adapter name."""
        return [v for v in self._serving(pool) if v.kind == "lora"]

    def unload_adapter(self, pool: str, name: str, message: str = "") -> RegisteredVersion:
        """Retires the serving version of adapter `name` (its workers unloaded it)."""
        adapter = next((v for v in self.serving_adapters(pool) if v.name == name), None)
        if adapter is None:
            raise RegistryError(f"pool {pool!r} serves no adapter named {name!r}")
        with self.engine.begin() as conn:
            _set_status(conn, pool, adapter.version, "retired", time.time())
            _add_event(conn, pool, adapter.version, "retired", message or "adapter unloaded")
        return self.get(pool, adapter.version)

    def _serving(self, pool: str) -> list[RegisteredVersion]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(policy_versions).where(policy_versions.c.pool == pool,
                                                              policy_versions.c.status == "serving")
                                .order_by(policy_versions.c.version))
            return [_version(row) for row in rows]

    def previous(self, pool: str) -> RegisteredVersion | None:
        """The version that served before the current one and was not rolled back from: the rollback target."""
        current = self.current(pool)
        history = self._activation_history(pool)
        earlier = [version for version in history if current is None or version != current.version]
        return self.get(pool, earlier[-1]) if earlier else None

    def _activation_history(self, pool: str) -> list[int]:
        full = {v.version for v in self.list(pool) if v.kind == "full"}
        stack: list[int] = []
        for event in self.events(pool):
            if event.version not in full:
                continue
            if event.event == "deploy_finished" and (not stack or stack[-1] != event.version):
                stack.append(event.version)
            elif event.event == "rolled_back" and event.version in stack:
                _remove_last(stack, event.version)
        return stack

    def get(self, pool: str, version: int) -> RegisteredVersion:
        found = self._find(pool, version)
        if found is None:
            raise RegistryError(f"pool {pool!r} has no version {version}")
        return found

    def list(self, pool: str | None = None) -> list[RegisteredVersion]:
        query = select(policy_versions).order_by(policy_versions.c.pool, policy_versions.c.version)
        if pool is not None:
            query = query.where(policy_versions.c.pool == pool)
        with self.engine.connect() as conn:
            return [_version(row) for row in conn.execute(query)]

    def events(self, pool: str, version: int | None = None) -> list[DeploymentEvent]:
        query = select(deployment_events).where(deployment_events.c.pool == pool).order_by(deployment_events.c.id)
        if version is not None:
            query = query.where(deployment_events.c.version == version)
        with self.engine.connect() as conn:
            return [DeploymentEvent(**row._mapping) for row in conn.execute(query)]

    def _find(self, pool: str, version: int) -> RegisteredVersion | None:
        with self.engine.connect() as conn:
            return _find(conn, pool, version)

    def _require_current(self, pool: str) -> RegisteredVersion:
        current = self.current(pool)
        if current is None:
            raise RegistryError(f"pool {pool!r} has no serving version: register_base it first")
        return current


def _remove_last(stack: list[int], version: int) -> None:
    last = len(stack) - 1 - stack[::-1].index(version)
    del stack[last]


def _version(row) -> RegisteredVersion:
    return RegisteredVersion(**row._mapping)


def _find(conn: Connection, pool: str, version: int) -> RegisteredVersion | None:
    row = conn.execute(select(policy_versions).where(policy_versions.c.pool == pool,
                                                     policy_versions.c.version == version)).first()
    return _version(row) if row is not None else None


def _transition(conn: Connection, pool: str, version: int, status: str, message: str) -> None:
    if status not in STATUSES:
        raise RegistryError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    found = _find(conn, pool, version)
    if found is None:
        raise RegistryError(f"pool {pool!r} has no version {version}")
    if status not in ALLOWED_TRANSITIONS[found.status]:
        raise RegistryError(f"version {version} of pool {pool!r} is {found.status}; it cannot become {status}")
    now = time.time()
    if status == "deploying":
        _refuse_second_deploy(conn, pool)
    if status == "serving":
        _retire_serving(conn, found, now=now)
    _set_status(conn, pool, version, status, now)
    _add_event(conn, pool, version, EVENT_OF_STATUS[status], message)


def _retire_serving(conn: Connection, replacement: RegisteredVersion, now: float) -> None:
    """Retires what `replacement` replaces: the serving full weights, or the serving version of the same adapter."""
    same_track = [policy_versions.c.pool == replacement.pool, policy_versions.c.status == "serving",
                  policy_versions.c.kind == replacement.kind]
    if replacement.kind == "lora":
        same_track.append(policy_versions.c.name == replacement.name)
    serving = conn.execute(select(policy_versions.c.version).where(*same_track)).scalars()
    for version in list(serving):
        _set_status(conn, replacement.pool, version, "retired", now)
        _add_event(conn, replacement.pool, version, "retired", f"replaced by version {replacement.version}")


def _set_status(conn: Connection, pool: str, version: int, status: str, now: float) -> None:
    conn.execute(update(policy_versions)
                 .where(policy_versions.c.pool == pool, policy_versions.c.version == version)
                 .values(status=status, updated_at=now))


def _add_event(conn: Connection, pool: str, version: int, event: str, message: str) -> None:
    conn.execute(deployment_events.insert().values(pool=pool, version=version, event=event, message=message,
                                                   created_at=time.time()))


def _refuse_second_deploy(conn: Connection, pool: str) -> None:
    deploying = conn.execute(select(policy_versions.c.version).where(
        policy_versions.c.pool == pool, policy_versions.c.status == "deploying")).scalar()
    if deploying is not None:
        raise RegistryError(f"version {deploying} of pool {pool!r} is deploying; finish or fail it first")
