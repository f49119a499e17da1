"""Which pool serves a request, and whether the caller may use it.

`model` may name a pool: "tiny-qwen2@team-a". Without one, a team that owns a reserved pool is served
there and everyone else by the default pool. A reserved pool answers its own team's keys only (403
for the others; admins reach every pool).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.ids import DEFAULT_POOL, PoolName
from engine.supervisor.pool_config import PoolConfig
from finetune_deploy.served_models import ModelTable, ServedModel
from rollout_server.auth import Principal
from rollout_server.errors import APIError, model_not_found


@dataclass(frozen=True)
class Target:
    model: ServedModel  # the served model, named without the pool
    pool: PoolName


def target(model_field: str, who: Principal, pools: dict[str, PoolConfig], models: ModelTable) -> Target:
    model_id, named, pool_name = model_field.partition("@")
    model = models.get(model_id)
    if model is None:
        raise model_not_found(model_id)
    if named:
        config = pools.get(pool_name)
        if config is None:
            raise APIError(404, f"The pool `{pool_name}` does not exist (model `{model_field}`).", param="model",
                           code="model_not_found")
        if not config.reachable_by(who.team, who.is_admin):
            raise APIError(403, f"The pool `{pool_name}` is reserved for another team; your key cannot use it.",
                           param="model", code="pool_reserved")
        return Target(model, PoolName(pool_name))
    owned = next((name for name, c in pools.items() if c.kind == "reserved" and c.team == who.team), None)
    return Target(model, PoolName(owned) if owned else DEFAULT_POOL)


def reachable_pools(who: Principal, pools: dict[str, PoolConfig]) -> list[str]:
    return [name for name, config in pools.items() if name != DEFAULT_POOL and config.reachable_by(who.team, who.is_admin)]
