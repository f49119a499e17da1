"""POST /v1/traces/rewards: attach rewards, advantages and metrics to traces or sessions.

Body: {"rewards": [{"request_id" | "session_id": ..., "choice_index"?: int,
                    "reward"?: float, "advantage"?: float, "metrics"?: {name: float}}, ...]}
All items are checked before any is stored (all or nothing). The caller's team comes
from team_of_request; targets of another team are refused (403). Errors use the
OpenAI shape {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Awaitable, Callable

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rollout_server.errors import APIError, error_response, error_responses
from rollout_server.fast_json import parse_json
from rollout_server.openapi import DocumentedModel, json_body
from trace_pipeline.capture import TraceCapture
from trace_pipeline.rewards import RewardError, RewardInput, attach_rewards
from trace_pipeline.store import TraceStore

# A reward naming no trace is the request's mistake, not a missing route: an invalid_request_error
_REWARD_NOT_FOUND_TYPE = "invalid_request_error"


class RewardItem(DocumentedModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    schema_rules = (  # what attach_rewards checks (trace_pipeline/rewards.py, _validate)
        {"oneOf": [  # a request or a session
            {"properties": {"request_id": {"type": "string"}}, "required": ["request_id"]},
            {"properties": {"session_id": {"type": "string"}}, "required": ["session_id"]},
        ]},
        {"anyOf": [  # a choice of a request only
            {"properties": {"session_id": {"type": "null"}}},
            {"properties": {"choice_index": {"type": "null"}}},
        ]},
        {"anyOf": [  # something to attach
            {"properties": {"reward": {"not": {"type": "null"}}}, "required": ["reward"]},
            {"properties": {"advantage": {"not": {"type": "null"}}}, "required": ["advantage"]},
            {"properties": {"metrics": {"minProperties": 1}}, "required": ["metrics"]},
        ]},
    )
    request_id: str | None = None
    session_id: str | None = None
    choice_index: int | None = pydantic.Field(default=None, ge=0, le=2**31 - 1)
    reward: float | None = None
    advantage: float | None = None
    metrics: dict[str, float] = pydantic.Field(default_factory=dict)


class RewardsBody(DocumentedModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    rewards: list[RewardItem] = pydantic.Field(min_length=1)


def _refused(status: int, message: str, param: str | None, code: str) -> JSONResponse:
    return error_response(APIError(status, message, param=param, code=code,
                                   type=_REWARD_NOT_FOUND_TYPE if status == 404 else None))


def rewards_router(capture_or_store: TraceCapture | TraceStore,
                   team_of_request: Callable[[Request], Awaitable[str]]) -> APIRouter:
    store = capture_or_store.store if isinstance(capture_or_store, TraceCapture) else capture_or_store
    router = APIRouter()

    @router.post("/v1/traces/rewards", responses=error_responses(400, 401, 403, 404, 413),
                 openapi_extra=json_body(RewardsBody))
    async def post_rewards(request: Request):
        team = await team_of_request(request)
        try:
            raw = parse_json(await request.body())
        except ValueError as exc:
            return _refused(400, f"body is not valid JSON: {exc}", None, "invalid_json")
        try:
            body = RewardsBody.model_validate(raw)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            message = f"{param}: {first['msg']}" if param else first["msg"]
            return _refused(400, message, param, "invalid_reward")
        items = [RewardInput(**item.model_dump()) for item in body.rewards]
        try:
            rows = await asyncio.to_thread(attach_rewards, store, team, items)
        except RewardError as exc:
            return _refused(exc.status, exc.message, f"rewards.{exc.index}.{exc.param}", exc.code)
        data = [{"object": "trace.reward", **dataclasses.asdict(row)} for row in rows]
        return {"object": "list", "data": data}

    return router
