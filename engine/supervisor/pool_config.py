"""Capacity pools, as the operator declares them in a TOML file (`rollout-serve up --pools-file F`).

    [pools.team-a]          # reserved: fixed size, only team-a's keys reach it
    kind = "reserved"
    team = "team-a"
    workers = 2

    [pools.burst]           # serverless: scales with demand, to zero when idle
    kind = "serverless"
    min_workers = 0
    max_workers = 2
    idle_s = 300

Every pool serves the stack's model. The stack's own workers (`--workers N`) form the implicit
"default" pool, open to every team. A pool may run several deployments (`deployments = 2`: one Dynamo
frontend with its own workers each, e.g. one per region) so that one can fail and the other serves.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.ids import DEFAULT_POOL

MAX_WORKERS_PER_DEPLOYMENT = 19  # each deployment gets a block of 40 ports (pool_ports)


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: Literal["serverless", "reserved", "shared"]
    team: str | None = Field(None, description="reserved pools: the team whose keys reach the pool")
    workers: int = Field(1, ge=1, le=MAX_WORKERS_PER_DEPLOYMENT, description="reserved: workers per deployment")
    min_workers: int = Field(0, ge=0, description="serverless: workers kept when idle (0: scale to zero)")
    max_workers: int = Field(1, ge=1, le=MAX_WORKERS_PER_DEPLOYMENT, description="serverless: most workers")
    scale_up_in_flight: int = Field(4, ge=1, description="serverless: add a worker when requests in flight per "
                                                         "ready worker exceed this")
    idle_s: float = Field(300.0, gt=0, description="serverless: remove a worker after this long without requests")
    cold_start_timeout_s: float = Field(300.0, gt=0, description="serverless: how long a request waits for a "
                                                                 "worker to start")
    deployments: int = Field(1, ge=1, le=4, description="Dynamo deployments (frontend + workers) the pool runs")

    @model_validator(mode="after")
    def _consistent(self) -> PoolConfig:
        if self.kind == "reserved" and not self.team:
            raise ValueError("a reserved pool needs `team`, the team whose keys reach it")
        if self.kind != "reserved" and self.team:
            raise ValueError("`team` is for reserved pools only")
        if self.kind == "serverless" and self.min_workers > self.max_workers:
            raise ValueError("min_workers must not exceed max_workers")
        if self.kind == "serverless" and self.deployments > 1:
            raise ValueError("a serverless pool runs one deployment (its workers scale instead)")
        return self

    @property
    def initial_workers(self) -> int:
        return self.min_workers if self.kind == "serverless" else self.workers

    def reachable_by(self, team: str, is_admin: bool = False) -> bool:
        return self.kind != "reserved" or team == self.team or is_admin


class PoolFileError(ValueError):
    pass


def load_pools(path: Path) -> list[PoolConfig]:
    """The pools a file declares, or an error naming the file and the offending field."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PoolFileError(f"pools file {path}: {exc}") from None
    unknown = set(raw) - {"pools"}
    if unknown:
        raise PoolFileError(f"pools file {path}: unknown section(s) {sorted(unknown)}; pools go under [pools.NAME]")
    pools = []
    for name, fields in (raw.get("pools") or {}).items():
        if name == DEFAULT_POOL:
            raise PoolFileError(f"pools file {path}: `{DEFAULT_POOL}` is the stack's own pool (--workers); "
                                "name yours differently")
        try:
            pools.append(PoolConfig(name=name, **fields))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in ("pools", name, *first["loc"]))
            raise PoolFileError(f"pools file {path}: {where}: {first['msg']}") from None
    return pools


def pool_ports(base_port: int, block: int) -> dict[str, int]:
    """Ports of a pool deployment's block: its frontend, then worker system ports, then KV-event ports."""
    start = base_port + 40 * block
    return {"frontend_port": start, "worker_system_base_port": start + 1, "kv_events_base_port": start + 21}
