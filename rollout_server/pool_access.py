"""Which pool serves a request, and whether the caller may use it.

`model` may name a pool: "tiny-qwen2@team-a". Without one, a team that owns a reserved pool is served
there and everyone else by the default pool. A reserved pool answers its own team's keys only (403
for the others; admins reach every pool).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.pool_config import DEFAULT_POOL, PoolConfig
from rollout_server.auth import Principal
from rollout_server.errors import APIError
from rollout_server.served_models import ModelTable


@dataclass(frozen=True)
class Route:
    model: str    # the served model id, without the pool
    pool: str


def route(model_field: str, who: Principal, pools: dict[str, PoolConfig], models: ModelTable) -> Route:
    model_id, named, pool_name = model_field.partition("@")
    models.resolve(model_id)
    if named:
        config = pools.get(pool_name)
        if config is None:
            raise APIError(404, f"The pool `{pool_name}` does not exist (model `{model_field}`).", param="model",
                           code="model_not_found")
        if not config.reachable_by(who.team, who.is_admin):
            raise APIError(403, f"The pool `{pool_name}` is reserved for another team; your key cannot use it.",
                           param="model", code="pool_reserved")
        return Route(model_id, pool_name)
    owned = next((name for name, c in pools.items() if c.kind == "reserved" and c.team == who.team), None)
    return Route(model_id, owned or DEFAULT_POOL)


def reachable_pools(who: Principal, pools: dict[str, PoolConfig]) -> list[str]:
    return [name for name, config in pools.items() if name != DEFAULT_POOL and config.reachable_by(who.team, who.is_admin)]
