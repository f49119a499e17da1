"""The front door: rollout-serve's FastAPI application.

Clients speak OpenAI (and vLLM's token-in/token-out route) to this app; it
authenticates, tokenizes, sends token ids to Dynamo's frontend, and answers with
exact token ids, the serving worker and the policy version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rollout_server.auth import Authenticator, Principal
from rollout_server.chat import chat_completions
from rollout_server.completions import completions, generate
from rollout_server.errors import install_error_handlers
from rollout_server.generation import ServingContext
from rollout_server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

log = logging.getLogger(__name__)


@dataclass
class AppState:
    ctx: ServingContext
    auth: Authenticator
    stack: object | None = None   # engine.stack.Stack when this process started the stack
    traces: object | None = None  # rollout_server.tracing.TraceHook when trace capture is on
    started_at: float = 0.0


def create_app(state: AppState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.started_at = time.time()
        yield
        await state.ctx.client.close()
        if state.traces is not None:
            await state.traces.close()

    app = FastAPI(title="rollout-serve", version="0.1.0", lifespan=lifespan)
    app.state.rollout = state
    install_error_handlers(app)
    ctx = state.ctx

    def principal(request: Request) -> Principal:
        return state.auth.authenticate(request.headers.get("authorization"))

    if state.traces is not None:
        from trace_pipeline.api import rewards_router

        app.include_router(rewards_router(state.traces.capture, lambda request: principal(request).team))

    @app.get("/health")
    async def health():
        rows = await _worker_rows(state)
        healthy = sum(1 for r in rows if r["healthy"]) if rows is not None else None
        ok = healthy is None or healthy > 0
        body = {"status": "ok" if ok else "unavailable", "healthy_workers": healthy, "model": ctx.model_name}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        rows = await _worker_rows(state)
        if rows:
            ctx.metrics.update_workers(rows)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(who: Principal = Depends(principal)):
        return {"object": "list", "data": [{
            "id": ctx.model_name, "object": "model", "created": int(state.started_at), "owned_by": "rollout-serve",
            "root": str(ctx.settings.model or ctx.model_name), "parent": None,
            "max_model_len": ctx.max_model_len, "policy_version": ctx.policy_version,
        }]}

    @app.get("/v1/status")
    async def status(who: Principal = Depends(principal)):
        rows = await _worker_rows(state)
        return {"model": ctx.model_name, "policy_version": ctx.policy_version, "workers": rows or [],
                "requests_in_flight": sum(g._value.get() for g in ctx.metrics.in_flight._metrics.values()),
                "cache_hit_rate": ctx.metrics.cache_hit_rate(), "uptime_s": time.time() - state.started_at,
                "open_mode": state.auth.open_mode}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request, who: Principal = Depends(principal)):
        return await chat_completions(ctx, body, request, who.team)

    @app.post("/v1/completions")
    async def complete(body: CompletionRequest, request: Request, who: Principal = Depends(principal)):
        return await completions(ctx, body, request, who.team)

    @app.post("/inference/v1/generate")
    async def tito(body: GenerateRequest, request: Request, who: Principal = Depends(principal)):
        return await generate(ctx, body, request, who.team)

    return app


async def _worker_rows(state: AppState) -> list[dict] | None:
    if state.stack is None:
        return None
    return await asyncio.to_thread(state.stack.worker_status)
