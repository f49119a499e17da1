"""GET /v1/usage: what each team and key used (rollout_server/usage.py keeps the counts)."""

from __future__ import annotations

import asyncio
from typing import Callable

from fastapi import APIRouter, Depends, Query

from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request
from rollout_server.times import unix_time
from rollout_server.usage import UsageQuery, UsageStore, parse_group_by


def usage_router(store: UsageStore, principal_dependency: Callable[..., Principal]) -> APIRouter:
    """GET /v1/usage?since=&until=&group_by=team,key,model,pool,day&team=&key=&model=

    A team sees its own usage; only an admin may name another team (or omit team= for all)."""
    router = APIRouter()

    @router.get("/v1/usage")
    async def get_usage(since: str | None = None, until: str | None = None, group_by: list[str] = Query([]),
                        team: str | None = None, key: str | None = None, model: str | None = None,
                        who: Principal = Depends(principal_dependency)):
        query = UsageQuery(team=_team_for(who, team), key_prefix=key, model=model,
                           since=_time_param(since, "since"), until=_time_param(until, "until"),
                           group_by=_group_by_param(group_by))
        rows = await asyncio.to_thread(store.totals, query)
        return {"object": "list", "team": query.team, "since": query.since, "until": query.until,
                "group_by": list(query.group_by), "data": [row.to_json() for row in rows]}

    return router


def _team_for(who: Principal, requested: str | None) -> str | None:
    if who.is_admin:
        return requested
    if requested is not None and requested != who.team:
        raise APIError(403, "Only admins may read another team's usage.", param="team", code="forbidden_team")
    return who.team


def _time_param(text: str | None, param: str) -> float | None:
    if text is None:
        return None
    try:
        return unix_time(text)
    except ValueError as exc:
        raise bad_request(f"'{param}' must be unix seconds or an ISO 8601 time: {exc}", param=param,
                          code="invalid_value") from exc


def _group_by_param(values: list[str]) -> tuple[str, ...]:
    try:
        return parse_group_by(values)
    except ValueError as exc:
        raise bad_request(str(exc), param="group_by", code="invalid_value") from exc
