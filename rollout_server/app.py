"""The front door: rollout-serve's ASGI application.

Clients speak OpenAI (and vLLM's token-in/token-out route) to this app; it authenticates, tokenizes, sends
token ids to the engine, and answers with exact token ids, the serving worker and the policy version. The
generation routes are served in front of FastAPI (rollout_server/generation_routes.py); FastAPI serves the
rest (models, health, metrics, tokenize), and the routers of rollout_server/routes/ (usage, rewards,
deploys, batches). Each route declares the error statuses it can answer (`responses=`), and /openapi.json
describes every route, the generation routes included (rollout_server/openapi.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from engine.ids import DEFAULT_POOL
from engine.supervisor.health import StackHealth
from engine.supervisor.pools import PoolSet
from finetune_deploy.executor import Deployer
from finetune_deploy.weight_transfer import WeightTransfer
from rollout_server.auth import Authenticator, Principal
from rollout_server.batch_runner import BatchRunner
from rollout_server.body_deadline import BodyDeadline
from rollout_server.errors import error_responses, install_error_handlers, model_not_found
from rollout_server.fast_json import msgspec_route
from rollout_server.generation_routes import ERROR_STATUSES as GENERATION_ERROR_STATUSES
from rollout_server.generation_routes import GENERATION_ROUTES, GenerationRoutes, client_host, principal_of, validated
from rollout_server.openapi import install_openapi
from rollout_server.pool_access import reachable_pools
from rollout_server.protocol import DetokenizeRequest, TokenizeRequest
from rollout_server.routes.batches import batches_router
from rollout_server.routes.deployments import deploy_router
from rollout_server.routes.rewards import rewards_router
from rollout_server.routes.usage import usage_router
from rollout_server.routes.weight_transfer import weight_transfer_router
from rollout_server.serving.context import ServingContext
from rollout_server.tokenization import detokenize, tokenize
from rollout_server.tracing import TraceHook
from rollout_server.usage import UsageRecorder

log = logging.getLogger(__name__)


@dataclass
class AppState:
    ctx: ServingContext
    auth: Authenticator
    health: StackHealth | None = None  # of the stack this process started (None: tests without one)
    traces: TraceHook | None = None    # when trace capture is on
    usage: UsageRecorder | None = None
    batches: BatchRunner | None = None
    deployer: Deployer | None = None   # when the stack's workers can be deployed to
    weight_transfer: WeightTransfer | None = None  # a trainer's pushed weights, to the deployer's pool
    pools: PoolSet | None = None       # the default pool and the declared ones
    started_at: float = 0.0


class HealthBody(BaseModel):
    """GET /health, with a 200 while a worker is healthy (or no stack is watched), else a 503."""

    status: Literal["ok", "unavailable"]
    healthy_workers: int | None
    model: str


def internal_execute(ctx: ServingContext):
    """The Batch API's way in: one request line run through the same handlers as HTTP requests, as the key that
    created its batch (its rate limits included); an error is raised as an APIError, for the runner to read."""
    async def execute(url: str, body: dict, who: Principal) -> tuple[int, dict]:
        route = GENERATION_ROUTES[url]
        response = await route.handler(ctx, validated(route.body, {**body, "stream": False}), None, who)
        return response.status_code, json.loads(response.body)
    return execute


def create_app(state: AppState) -> BodyDeadline:
    """The front door's ASGI app: each request's body due in time (rollout_server/body_deadline.py), then the
    generation routes (rollout_server/generation_routes.py, which authenticate every request with a body before
    reading it) in front of the FastAPI app that serves everything else."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.started_at = time.time()
        if state.pools is not None:
            await state.pools.check_once()  # deployments in rotation before the first request
        if state.usage is not None:
            state.usage.start()
        if state.batches is not None:
            await state.batches.start()
        if state.deployer is not None:
            await state.deployer.restore()
        supervisor = asyncio.create_task(state.pools.supervise()) if state.pools is not None else None
        yield
        if supervisor is not None:
            supervisor.cancel()
        if state.batches is not None:
            await state.batches.stop()
        await state.ctx.wrapped_up()  # the last answers' bookkeeping, while its stores and engine streams are open
        await state.ctx.client.close()
        if state.traces is not None:
            await state.traces.close()
        if state.usage is not None:
            await asyncio.to_thread(state.usage.close)

    app = FastAPI(title="rollout-serve", version="0.1.0", lifespan=lifespan)
    max_body_bytes = int(state.ctx.settings.server.max_request_body_mib * 2**20)
    app.router.route_class = msgspec_route(max_body_bytes, state.ctx.settings.limits.max_json_depth)
    app.state.rollout = state
    install_error_handlers(app)
    install_openapi(app, {path: route.body for path, route in GENERATION_ROUTES.items()}, GENERATION_ERROR_STATUSES,
                    state.ctx.tokenizer.vocab_size if state.ctx.tokenizer is not None else None)
    ctx = state.ctx

    async def caller(request: Request) -> Principal:
        """The request's principal, as a dependency (an async one: FastAPI runs a plain function in a worker
        thread, a hand-off that costs more per request than a key already read): authenticated before its body
        was read when it may carry one (rollout_server/generation_routes.py), else now."""
        return principal_of(request.scope) or await state.auth.authenticate(request.headers.get("authorization"),
                                                                            client_host(request.scope))

    if state.traces is not None:
        async def team_of(request: Request) -> str:
            return (await caller(request)).team

        app.include_router(rewards_router(state.traces.capture, team_of))
    if state.usage is not None:
        app.include_router(usage_router(state.usage.store, caller))
    if state.deployer is not None:
        app.include_router(deploy_router(state.deployer, caller, state.weight_transfer))
    if state.weight_transfer is not None:
        app.include_router(weight_transfer_router(state.weight_transfer, caller))
    if state.batches is not None:
        app.include_router(batches_router(state.batches.store, caller, runner=state.batches,
                                          max_file_bytes=ctx.settings.batches.max_file_bytes))

    @app.get("/health", responses={200: {"model": HealthBody},
                                   503: {"model": HealthBody, "description": "No worker is healthy."}})
    async def health():
        rows = await _worker_rows(state)
        healthy = sum(1 for r in rows if r["healthy"]) if rows is not None else None
        ok = healthy is None or healthy > 0
        body = {"status": "ok" if ok else "unavailable", "healthy_workers": healthy, "model": ctx.model_name}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse)  # Prometheus' text format
    async def metrics():
        rows = await _worker_rows(state)
        if rows:
            ctx.metrics.update_workers(rows)
        if state.pools is not None:
            ctx.metrics.update_pools([pool.describe() for pool in state.pools.pools.values()])
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    def model_cards(who: Principal) -> list[dict]:
        listed = [(m, m.id) for m in ctx.models.listing()]
        listed += [(ctx.models.base, f"{ctx.models.base.id}@{pool}") for pool in reachable_pools(who, ctx.pools)]
        return [{
            "id": model_id, "object": "model", "created": int(m.created), "owned_by": "rollout-serve",
            "root": m.path or m.id, "parent": m.parent,
            "max_model_len": ctx.max_model_len, "policy_version": m.policy_version,
        } for m, model_id in listed]

    @app.get("/v1/models", responses=error_responses(401))
    async def models(who: Principal = Depends(caller)):
        return {"object": "list", "data": model_cards(who)}

    @app.get("/v1/models/{model_id:path}", responses=error_responses(401, 404))
    async def model(model_id: str, who: Principal = Depends(caller)):
        card = next((c for c in model_cards(who) if c["id"] == model_id), None)
        if card is None:
            raise model_not_found(model_id)
        return card

    @app.get("/v1/pools", responses=error_responses(401))
    async def pools(who: Principal = Depends(caller)):
        reachable = {DEFAULT_POOL, *reachable_pools(who, ctx.pools)}
        rows = [p.describe() for name, p in state.pools.pools.items() if name in reachable] if state.pools else []
        return {"object": "list", "data": rows}

    @app.get("/v1/status", responses=error_responses(401))
    async def status(who: Principal = Depends(caller)):
        rows = await _worker_rows(state)
        for row in rows or []:
            row["policy_version"] = ctx.models.version_of_worker(row.get("instance_id"))
            row["paused"] = state.deployer is not None and f"worker-{row['worker']}" in state.deployer.paused_since
            if row.get("instance_id") is not None:
                row["instance_id"] = str(row["instance_id"])  # worker ids leave the process as decimal text
        return {"model": ctx.model_name, "policy_version": ctx.models.base.policy_version, "workers": rows or [],
                "adapters": {name: m.policy_version for name, m in ctx.models.adapters.items()},
                "requests_in_flight": ctx.metrics.requests_in_flight(),
                "cache_hit_rate": ctx.metrics.cache_hit_rate(), "uptime_s": time.time() - state.started_at,
                "open_mode": state.auth.open_mode,
                "pools": [p.describe() for p in state.pools.pools.values()] if state.pools else []}

    @app.post("/tokenize", responses=error_responses(400, 401, 403, 404, 413))
    async def tokenize_route(body: TokenizeRequest, request: Request, who: Principal = Depends(caller)):
        return await tokenize(ctx, body, request.headers.get("x-session-id"), who)

    @app.post("/detokenize", responses=error_responses(400, 401, 403, 404, 413))
    async def detokenize_route(body: DetokenizeRequest, who: Principal = Depends(caller)):
        return await detokenize(ctx, body, who)

    routes = GenerationRoutes(app, ctx, state.auth, max_body_bytes, max_json_depth=ctx.settings.limits.max_json_depth)
    return BodyDeadline(routes, ctx.settings.server.body_timeout_s)


async def _worker_rows(state: AppState) -> list[dict] | None:
    if state.health is None:
        return None
    return await asyncio.to_thread(state.health.worker_status)
