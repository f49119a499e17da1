"""The front door in-process, with its key, usage, deploy and batch routes and no engine behind it, for the
security tests: callers from any address (httpx.ASGITransport's `client`), or over a real socket (uvicorn as
`rollout-serve up` configures it)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import create_engine

from finetune_deploy.executor import Deployer
from finetune_deploy.registry import CheckpointRegistry
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from rollout_server.app import AppState, create_app
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.harness.stack import free_port_block
from rollout_server.metrics import Metrics
from rollout_server.server import batch_runner, uvicorn_config
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings
from rollout_server.usage import UsageRecorder, UsageStore
from tests.tiny_models import untrained_tiny_model


async def no_workers_double():
    return []


def front_door(tmp_path: Path, open_mode: bool, **settings) -> tuple:
    """(the ASGI app, its key store, its settings): keys in tmp_path's database, no key made yet."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = Settings(database_url=url, state_dir=tmp_path, open_mode=open_mode, **settings)
    database = open_database(url)
    keys = KeyStore(database)
    registry = CheckpointRegistry(create_engine(url))
    registry.register_base("default", untrained_tiny_model(), "tiny-qwen2")
    models = ModelTable("tiny-qwen2", 0, str(untrained_tiny_model()))
    ctx = ServingContext(settings=settings, tokenizer=None, client=None, metrics=Metrics(), models=models,
                         max_model_len=32768)
    state = AppState(ctx=ctx, auth=Authenticator(keys, recheck_s=0, open_mode=open_mode),
                     usage=UsageRecorder(UsageStore(database)), batches=batch_runner(settings, ctx),
                     deployer=Deployer(registry, models, no_workers_double, DeploySettings()))
    return create_app(state), keys, settings


def call(app, method: str, path: str, client: str = "127.0.0.1", key: str | None = None, headers: dict | None = None,
         **kwargs) -> httpx.Response:
    """One request to `app` from a client at address `client`."""
    async def go():
        transport = httpx.ASGITransport(app=app, client=(client, 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as http:
            sent = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
            return await http.request(method, path, headers=sent, **kwargs)
    return asyncio.run(go())


@contextlib.contextmanager
def served_over_http(app, settings: Settings):
    """`app` behind uvicorn, configured as `rollout-serve up` does, on a free port: yields its (host, port)."""
    port = free_port_block(1)
    config = uvicorn_config(app, settings.server.model_copy(update={"port": port}))
    config.lifespan = "off"  # no engine, usage flusher or batch runner to start: the routes alone are served
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.05)
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
