"""Wiring: settings + a running stack -> the front door's state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from functools import partial
from pathlib import Path

import uvicorn

from engine.client.dispatch import Dispatcher
from engine.ids import BASE_VERSION, DEFAULT_POOL, PolicyVersion
from engine.supervisor.pools import PoolSet
from engine.supervisor.stack import Stack
from engine.supervisor.worker_control import WorkerHandle
from finetune_deploy.executor import Deployer
from finetune_deploy.registry import CheckpointRegistry, RegistryError
from finetune_deploy.served_models import ModelTable
from finetune_deploy.weight_transfer import WeightTransfer
from rollout_server.app import AppState, internal_execute
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.batch_runner import BatchRunner
from rollout_server.batches import BatchStore, open_batch_database
from rollout_server.http_protocol import HttpProtocol
from rollout_server.metrics import Metrics
from rollout_server.quotas import KeyLimitStore, RateLimiter
from rollout_server.serving.context import ServingContext
from rollout_server.settings import ServerSettings, Settings
from rollout_server.tokenizer import ModelTokenizer
from rollout_server.tracing import TraceHook
from rollout_server.usage import UsageRecorder, UsageStore
from trace_pipeline.capture import TraceCapture
from trace_pipeline.redact import TokenPieces, redact_record

log = logging.getLogger(__name__)


def model_context_window(model_dir: Path, settings: Settings) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    limit = settings.engine.max_model_len
    return min(limit, config.get("max_position_embeddings", limit))


def tool_format_of(tokenizer: ModelTokenizer):
    """The tool-call format the model's chat template renders, or None (the model cannot call tools)."""
    from rollout_server.tool_calls import format_for_chat_template

    template = tokenizer.hf.chat_template or ""
    try:
        fmt = format_for_chat_template(template)
    except LookupError:
        log.warning("the chat template renders no known tool-call format: requests with tools get a 400")
        return None
    log.info("tool calls: %s format (from the chat template)", fmt.name)
    return fmt


def batch_runner(settings: Settings, ctx: ServingContext) -> BatchRunner:
    store = BatchStore(open_batch_database(settings.batch_database_url), settings.batch_dir,
                       settings.batches.max_lines)
    runner: BatchRunner | None = None

    def interactive_requests_waiting() -> bool:
        # Batches run on spare capacity: they yield while any request of their own is not all that runs.
        return ctx.metrics.requests_in_flight() > (runner.in_flight if runner else 0)

    runner = BatchRunner(store, internal_execute(ctx), max_in_flight=settings.batches.max_in_flight,
                         should_yield=interactive_requests_waiting, poll_s=settings.batches.poll_s,
                         yield_sleep_s=settings.batches.yield_sleep_s,
                         retention_days=settings.batches.retention_days,
                         retention_bytes_per_team=settings.batches.retention_bytes_per_team,
                         retention_sweep_s=settings.batches.retention_sweep_s)
    return runner


def deployer_for(settings: Settings, database, model_dir: Path, model_name: str, stack: Stack,
                 pools: PoolSet) -> Deployer:
    """The pool's registry (base model = version 0) and the deployer that moves the stack's workers."""
    registry = CheckpointRegistry(database)
    try:
        registry.register_base(settings.deploy.pool, model_dir, model_name)
    except RegistryError as exc:
        raise SystemExit(f"{exc} (set ROLLOUT_SERVE_DEPLOY__POOL to serve it as another pool)") from None
    # The workers start on the base weights; Deployer.restore() puts back what the registry says serves.
    models = ModelTable(model_name, BASE_VERSION, str(model_dir))

    async def list_workers() -> list[WorkerHandle]:
        return await asyncio.to_thread(pools.worker_handles)  # every pool serves the same policy

    host_tier = StackTierKeys(stack) if settings.engine.kv_tier.enabled else None
    return Deployer(registry, models, list_workers, settings.deploy, host_tier, settings.engine.lora.enable_lora,
                    own_dirs=[settings.state.cache_dir, settings.state.resolved_state_dir])


class StackTierKeys:
    """finetune_deploy's HostTierKeys over the stack's per-worker version files."""

    def __init__(self, stack: Stack):
        self.stack = stack

    async def full_weights(self, worker: WorkerHandle, version: PolicyVersion) -> None:
        await asyncio.to_thread(self.stack.set_kv_tier_policy_version, version, [worker.index])

    async def adapter(self, worker: WorkerHandle, name: str, version: PolicyVersion | None) -> None:
        await asyncio.to_thread(self.stack.set_kv_tier_adapter_version, name, version, worker.index)


def build_app_state(settings: Settings, model_dir: Path, model_name: str, stack: Stack, pools: PoolSet) -> AppState:
    tokenizer = ModelTokenizer(model_dir, settings.server.session_prompt_tokens)
    database = open_database(settings.state.resolved_database_url)
    deployer = deployer_for(settings, database, model_dir, model_name, stack, pools)
    pools.current_weights = deployer.weights_for_new_workers
    pools.prepare_workers = deployer.load_serving_adapters
    ctx = ServingContext(
        settings=settings, tokenizer=tokenizer, client=Dispatcher(pools),
        metrics=Metrics(), models=deployer.models, max_model_len=model_context_window(model_dir, settings),
        tool_format=tool_format_of(tokenizer), pools={name: p.config for name, p in pools.pools.items()},
    )
    ctx.metrics.session_prompt_tokens_reused.set_function(lambda: tokenizer.session_prompts.reused_tokens)
    deployer.on_pause_ended = ctx.metrics.update_pause.observe
    auth = Authenticator(KeyStore(database, settings.server.admin_key), settings.server.keys_recheck_s,
                         open_mode=settings.server.open_mode)
    state = AppState(ctx=ctx, auth=auth, health=pools.pools[DEFAULT_POOL].deployments[0].health, deployer=deployer,
                     pools=pools, weight_transfer=WeightTransfer(deployer, settings.state.resolved_state_dir
                                                                  / "pushed-weights" / settings.deploy.pool))
    ctx.limiter = RateLimiter(KeyLimitStore(database, settings.quotas).limits_for)
    ctx.on_finish.append(ctx.limiter.on_finish)
    if settings.usage.enabled:
        state.usage = UsageRecorder(UsageStore(database), settings.usage.flush_every_s)
        ctx.on_finish.append(state.usage.on_finish)
    if settings.batches.enabled:
        state.batches = batch_runner(settings, ctx)
        ctx.metrics.watch_batches(lambda: state.batches.files_expired)
    if settings.traces.enabled:
        # Redaction masks the token ids of secrets too: it reads ids as text with the served model's tokenizer.
        redactor = partial(redact_record, token_pieces=TokenPieces(tokenizer.hf)) if settings.traces.redact else None
        capture = TraceCapture(settings.traces.model_copy(update={"dir": settings.trace_dir}), redactor=redactor)
        capture.start()
        state.traces = TraceHook(capture)
        ctx.metrics.watch_traces(lambda: capture.stats)
        ctx.on_finish.append(state.traces)
        log.info("trace capture on: %s", settings.trace_dir)
    return state


def uvicorn_config(app, server: ServerSettings) -> uvicorn.Config:
    """How the front door serves HTTP: its own protocol (rollout_server/http_protocol.py: headers due within
    `headers_timeout_s`), idle connections kept `keep_alive_timeout_s`, and at most `max_connections` connections
    served at once (uvicorn answers a request over it with a 503)."""
    return uvicorn.Config(app, host=server.host, port=server.port, log_level="warning", access_log=False,
                          http=partial(HttpProtocol, headers_timeout_s=server.headers_timeout_s),
                          timeout_keep_alive=server.keep_alive_timeout_s, limit_concurrency=server.max_connections)


class FrontDoorServer(uvicorn.Server):
    """uvicorn, except that SIGINT/SIGTERM end `run()` normally (uvicorn re-raises them after shutdown,
    which would kill the process before it stops the stack's children)."""

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
