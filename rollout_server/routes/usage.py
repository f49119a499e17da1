"""GET /v1/usage: what each team and key used (rollout_server/usage.py keeps the counts)."""

from __future__ import annotations

import asyncio
from typing import Callable

from fastapi import APIRouter, Depends, Query, Request

from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request, error_responses
from rollout_server.routes.admin import log_admin_action
from rollout_server.times import unix_time
from rollout_server.usage import GROUP_BY_FIELDS, UsageQuery, UsageStore, parse_group_by

# The query's forms as its schema says them (the handler's parsing is the rule; these forms are all read):
# a time (`unix_time`) as unix seconds within the years 1 to 9999 (as a number is written: 1733443200, -0.5,
# 1.5e-05), or an ISO 8601 date (years 1000-9999, days up to 28) with an optional time and zone; `group_by` as
# names of GROUP_BY_FIELDS separated by commas.
_UNIX_SECONDS = r"[+-]?([0-9]{1,10}|[0-9]{0,10}\.[0-9]+)([eE]-[0-9]{1,3})?|\+?[0-9]{11}(\.[0-9]+)?"
_ISO_8601 = (r"[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
             r"(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{6})?)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?)?")
_TIME = {"pattern": f"^({_UNIX_SECONDS}|{_ISO_8601})$"}
_NAME = f"({'|'.join(GROUP_BY_FIELDS)})?"
_GROUP_BY = {"items": {"type": "string", "pattern": f"^ *{_NAME} *(, *{_NAME} *)*$"}}


def usage_router(store: UsageStore, principal_dependency: Callable[..., Principal]) -> APIRouter:
    """GET /v1/usage?since=&until=&group_by=team,key,model,pool,day&team=&key=&model=

    A team sees its own usage; only an admin may name another team (or omit team= for all)."""
    router = APIRouter()

    @router.get("/v1/usage", responses=error_responses(400, 401, 403))
    async def get_usage(request: Request, since: str | None = Query(None, json_schema_extra=_TIME),
                        until: str | None = Query(None, json_schema_extra=_TIME),
                        group_by: list[str] = Query([], json_schema_extra=_GROUP_BY),
                        team: str | None = None, key: str | None = None, model: str | None = None,
                        who: Principal = Depends(principal_dependency)):
        if who.is_admin and team != who.team:  # another team's usage, or every team's
            log_admin_action(request, who)
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
