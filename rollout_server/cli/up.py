"""`rollout-serve up` (start everything, serve until Ctrl-C) and `rollout-serve model tiny` (build the tiny model)."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from rollout_server.cli.settings_flags import add_settings_arguments, settings_from_args

log = logging.getLogger("rollout_serve")


def add_up_commands(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start the front door, Dynamo's KV router and the vLLM workers",
                        description="Starts Dynamo's frontend (KV router), N vLLM workers (dynamo.vllm) and the "
                                    "OpenAI-compatible front door; Ctrl-C stops everything.")
    add_settings_arguments(up)
    up.set_defaults(func=cmd_up)

    model = sub.add_parser("model", help="build models").add_subparsers(dest="model_command", required=True)
    tiny = model.add_parser("tiny", help="build the tiny Qwen2 model (deterministic) and print its directory")
    tiny.add_argument("--variant", type=int, default=0, help="weights seed offset: 1 gives a second checkpoint")
    tiny.add_argument("--tool-format", choices=["hermes", "xml"], default="hermes",
                      help="tool-call syntax of the chat template: Hermes JSON or Qwen3-Coder XML parameters")
    tiny.add_argument("--cache-dir", help="cache directory (default: ROLLOUT_SERVE_CACHE_DIR or ~/.cache/rollout-serve)")
    tiny.set_defaults(func=cmd_model_tiny)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_up(args: argparse.Namespace) -> int:
    # Imported here: `rollout-serve --help` and the other commands do not pay for them.
    from engine.client.dispatch import client_for
    from engine.supervisor import cpu_placement
    from engine.supervisor.device import has_cuda
    from engine.supervisor.health import StackHealth
    from engine.supervisor.pool_config import PoolFileError, load_pools
    from engine.supervisor.pools import PoolSet
    from engine.supervisor.ports import is_free
    from engine.supervisor.stack import Stack, StackStartError
    from rollout_server.auth import is_loopback
    from rollout_server.database import DatabaseError, open_engine
    from rollout_server.tiny_model.builder import resolve_model

    settings = settings_from_args(args)
    engine, server = settings.engine, settings.server
    if server.open_mode and not is_loopback(server.host):  # said before anything starts
        log.error("--open-mode serves callers on loopback only, and --host %s is not a loopback address: start "
                  "with --host 127.0.0.1, or without --open-mode and with keys (`rollout-serve keys create "
                  "--team NAME`)", server.host)
        return 2
    try:
        declared = load_pools(engine.pools.pools_file) if engine.pools.pools_file else []
    except PoolFileError as exc:
        log.error("%s", exc)
        return 2
    if not is_free(server.port):  # said now, not after minutes of engine start-up
        log.error("port %d (the front door, --port) is already in use", server.port)
        return 1
    try:  # an unreachable database too: each is opened once, then again by the front door
        open_engine(settings.state.resolved_database_url).dispose()
        if settings.batches.enabled:
            open_engine(settings.batch_database_url).dispose()
    except DatabaseError as exc:
        log.error("%s", exc)
        return 1
    model_dir, model_name = resolve_model(settings)
    stack = Stack(engine, model_dir, model_name, state_dir=settings.state.resolved_state_dir,
                  cache_dir=settings.state.cache_dir,
                  workers=[] if engine.cluster else None)  # a cluster's workers join (rollout-serve worker)
    pools = PoolSet.build(engine, stack, declared, client_for)
    if not has_cuda():
        cpu_placement.keep_host_processes_off(pools.engine_cores(), pools.engine_cores(role="decode"))
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM during start-up stops like Ctrl-C: children first
    try:
        stack.start()
        pools.launch()
        # The front door's own imports (transformers, FastAPI: seconds) overlap the engines' start-up.
        from engine.supervisor.disaggregation import describe_workers
        from rollout_server.app import create_app
        from rollout_server.server import FrontDoorServer, build_app_state, uvicorn_config

        StackHealth(stack).wait_until_ready()
        pools.wait_until_ready()
        app = create_app(build_app_state(settings, model_dir, model_name, stack, pools))
        workers = (f"cluster mode: workers join through etcd, their KV events to {engine.internal_host}:"
                   f"{engine.event_broker_port}" if engine.cluster else describe_workers(engine))
        log.info("rollout-serve ready: http://%s:%d/v1 (model %s, %s)", server.host, server.port, model_name, workers)
        FrontDoorServer(uvicorn_config(app, server)).run()
        log.info("front door stopped")
    except StackStartError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        pools.stop(stack)
    return 0


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from rollout_server.tiny_model.builder import ensure_tiny_model  # torch: seconds

    cache = Path(args.cache_dir) / "models" if args.cache_dir else None
    print(ensure_tiny_model(args.variant, cache, args.tool_format))
    return 0
