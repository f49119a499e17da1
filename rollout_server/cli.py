"""`rollout-serve`: start the stack, chat with it, inspect it, manage keys and the tiny model."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from rollout_server.settings import Settings

log = logging.getLogger("rollout_serve")

DEFAULT_URL = os.environ.get("ROLLOUT_SERVE_URL", "http://127.0.0.1:8000")


# ---- settings <-> command line -------------------------------------------------------------

def _scalar_type(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return str, list(typing.get_args(annotation))
    return (annotation if annotation in (int, float, str, bool, Path) else str), None


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, documented by the field itself; unset flags fall back to env/defaults."""
    group = parser.add_argument_group("settings (also ROLLOUT_SERVE_<NAME> environment variables)")
    for name, field in Settings.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            continue  # nested sections are set through environment variables (see settings.py)
        flag = "--" + name.replace("_", "-")
        kind, choices = _scalar_type(field.annotation)
        default = field.default if field.default_factory is None else field.default_factory()
        help_text = f"{field.description} (default: {default})"
        if kind is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {name: getattr(args, name) for name in Settings.model_fields if getattr(args, name, None) is not None}
    return Settings(**given)


# ---- commands ----------------------------------------------------------------------------

def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_up(args: argparse.Namespace) -> int:
    from engine import cpu_placement
    from engine.pool_config import PoolFileError, load_pools
    from engine.pools import PoolSet
    from engine.ports import is_free
    from engine.stack import Stack, StackStartError, has_cuda
    from rollout_server.tiny_model import resolve_model

    settings = settings_from_args(args)
    try:
        declared = load_pools(settings.pools_file) if settings.pools_file else []
    except PoolFileError as exc:
        log.error("%s", exc)
        return 2
    if not is_free(settings.port):  # said now, not after minutes of engine start-up
        log.error("port %d (the front door, --port) is already in use", settings.port)
        return 1
    model_dir, model_name = resolve_model(settings)
    stack = Stack(settings, model_dir, model_name)
    pools = PoolSet.build(settings, stack, declared)
    if not has_cuda():
        cpu_placement.keep_host_processes_off(pools.engine_cores(), pools.engine_cores(role="decode"))
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM during start-up stops like Ctrl-C: children first
    try:
        stack.start(wait=False)
        pools.launch()
        # The front door's own imports (transformers, FastAPI: seconds) overlap the engines' start-up.
        import uvicorn

        from engine.disaggregation import describe_workers
        from rollout_server.app import create_app
        from rollout_server.http_protocol import HttpProtocol
        from rollout_server.server import FrontDoorServer, build_app_state

        stack.wait_until_ready()
        pools.wait_until_ready()
        app = create_app(build_app_state(settings, model_dir, model_name, stack, pools))
        log.info("rollout-serve ready: http://%s:%d/v1 (model %s, %s)", settings.host, settings.port,
                 model_name, describe_workers(settings))
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                                http=HttpProtocol)
        FrontDoorServer(config).run()
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
    from rollout_server.tiny_model import ensure_tiny_model

    cache = Path(args.cache_dir) / "models" if args.cache_dir else None
    print(ensure_tiny_model(args.variant, cache, args.tool_format))
    return 0


def _client_headers(args) -> dict:
    key = args.api_key or os.environ.get("ROLLOUT_SERVE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def cmd_chat(args: argparse.Namespace) -> int:
    import httpx

    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}]
    body = {"model": args.model, "messages": messages, "stream": True, "max_tokens": args.max_tokens,
            "temperature": args.temperature}
    with httpx.stream("POST", f"{args.url}/v1/chat/completions", json=body, headers=_client_headers(args),
                      timeout=600) as resp:
        if resp.status_code != 200:
            print(f"error {resp.status_code}: {resp.read().decode()}", file=sys.stderr)
            return 1
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                print(f"\nerror: {chunk['error']['message']}", file=sys.stderr)
                return 1
            for choice in chunk.get("choices", []):
                print(choice["delta"].get("content") or "", end="", flush=True)
    print()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import httpx

    try:
        status = httpx.get(f"{args.url}/v1/status", headers=_client_headers(args), timeout=10).json()
    except httpx.HTTPError as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if "error" in status:
        print(status["error"]["message"], file=sys.stderr)
        return 1
    print(f"model {status['model']}  policy version {status['policy_version']}  "
          f"in flight {status['requests_in_flight']:.0f}  cache hit rate {status['cache_hit_rate']:.1%}")
    print(f"{'worker':>6}  {'role':>10}  {'pid':>8}  {'healthy':>7}  {'in flight':>9}  {'version':>7}  instance id")
    for w in status["workers"]:
        print(f"{w['worker']:>6}  {w.get('role', '-'):>10}  {w['pid'] or '-':>8}  {str(w['healthy']):>7}  "
              f"{w['inflight_requests']:>9.0f}  "
              f"{w.get('policy_version', '-'):>7}  {w['instance_id'] or '-'}")
    for name, version in status.get("adapters", {}).items():
        print(f"adapter {name}: policy version {version}")
    if len(status.get("pools", [])) > 1:
        print()
        _print_pools(status["pools"])
    return 0


def _print_pools(pools: list[dict]) -> None:
    print(f"{'pool':<16}  {'kind':<10}  {'owner':<12}  {'workers':>7}  {'ready':>5}  {'min-max':>7}  {'in flight':>9}  "
          f"{'failovers':>9}  deployments (healthy)")
    for p in pools:
        deployments = ", ".join(f"{d['name']} ({'yes' if d['healthy'] else 'NO'})" for d in p["deployments"])
        print(f"{p['name']:<16}  {p['kind']:<10}  {p['team'] or '-':<12}  {p['workers']:>7}  {p['ready_workers']:>5}  "
              f"{str(p['min_workers']) + '-' + str(p['max_workers']):>7}  {p['in_flight']:>9}  {p['failovers']:>9}  "
              f"{deployments}")


def cmd_pools(args: argparse.Namespace) -> int:
    import httpx

    try:
        answer = httpx.get(f"{args.url}/v1/pools", headers=_client_headers(args), timeout=10)
    except httpx.HTTPError as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if answer.status_code != 200:
        print(answer.json().get("error", {}).get("message", answer.text), file=sys.stderr)
        return 1
    _print_pools(answer.json()["data"])
    return 0


def _key_store(args):
    from rollout_server.auth import KeyStore, open_database

    settings = settings_from_args(args)
    return KeyStore(open_database(settings.resolved_database_url))


def cmd_keys_create(args: argparse.Namespace) -> int:
    key = _key_store(args).create(args.team, name=args.name, is_admin=args.admin)
    print(key)
    print(f"created a key for team {args.team!r}; it is shown only once", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    for row in _key_store(args).list(args.team):
        print(f"{row['key_prefix']}…  team={row['team']}  name={row['name'] or '-'}  admin={row['is_admin']}  "
              f"revoked={row['revoked']}")
    return 0


def cmd_keys_limit(args: argparse.Namespace) -> int:
    from rollout_server.auth import open_database
    from rollout_server.quotas import KeyLimitStore

    settings = settings_from_args(args)
    KeyLimitStore(open_database(settings.resolved_database_url)).set(args.prefix, args.requests_per_min,
                                                                     args.tokens_per_min)
    print(f"key {args.prefix}: {args.requests_per_min or 'default'} requests/min, "
          f"{args.tokens_per_min or 'default'} tokens/min (a running server applies it within "
          f"{settings.quotas.limits_cache_s:.0f} s)")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    count = _key_store(args).revoke(args.prefix)
    print(f"revoked {count} key(s)")
    return 0 if count else 1


# ---- parser ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

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

    for name, func, text in (("chat", cmd_chat, "stream a chat answer"), ("status", cmd_status, "workers, load, cache hit rate"),
                             ("pools", cmd_pools, "capacity pools: kind, owner, size, load, deployment health")):
        p = sub.add_parser(name, help=text)
        if name == "chat":
            p.add_argument("model", help="model id (see GET /v1/models)")
            p.add_argument("prompt", help="the user message")
            p.add_argument("--system", help="system message")
            p.add_argument("--max-tokens", type=int, default=256)
            p.add_argument("--temperature", type=float, default=0.7)
        p.add_argument("--url", default=DEFAULT_URL, help=f"front door URL (default: {DEFAULT_URL})")
        p.add_argument("--api-key", help="API key (default: ROLLOUT_SERVE_API_KEY or OPENAI_API_KEY)")
        p.set_defaults(func=func)

    from finetune_deploy.cli import add_deploy_commands
    from rollout_server.usage import add_usage_commands
    from trace_pipeline.cli import add_traces_commands

    add_traces_commands(sub)
    add_usage_commands(sub)
    add_deploy_commands(sub)

    keys = sub.add_parser("keys", help="API keys (stored hashed)").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key for a team and print it once")
    create.add_argument("--team", required=True)
    create.add_argument("--name")
    create.add_argument("--admin", action="store_true", help="may deploy checkpoints and update weights")
    create.set_defaults(func=cmd_keys_create)
    listing = keys.add_parser("list", help="list keys (prefixes only)")
    listing.add_argument("--team")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke keys by prefix (a running server refuses them within "
                                            "keys_recheck_s, 2 s by default)")
    revoke.add_argument("prefix", help="the key's prefix (rollout-serve keys list), its first 10 characters")
    revoke.set_defaults(func=cmd_keys_revoke)
    limit = keys.add_parser("limit", help="set a key's rate limits (429 with Retry-After beyond them)")
    limit.add_argument("prefix", help="the key's prefix (rollout-serve keys list), its first 10 characters")
    limit.add_argument("--requests-per-min", type=int, help="requests per minute (unset: the server default; 0: none)")
    limit.add_argument("--tokens-per-min", type=int, help="prompt + completion tokens per minute (unset: default; 0: none)")
    limit.set_defaults(func=cmd_keys_limit)
    for p in (create, listing, revoke, limit):
        p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in the state directory)")
        p.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
        p.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)

    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("ROLLOUT_SERVE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    return args.run(args) if hasattr(args, "run") else args.func(args)


if __name__ == "__main__":
    sys.exit(main())
