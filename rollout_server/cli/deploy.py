"""`rollout-serve deploy | deployments | rollback`: the one-click path, from a terminal.

Each command talks to a running front door's admin API (an admin key, or open
local mode) and, for deploys and rollbacks, follows the progress until every
worker serves the version or the deploy failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_URL = os.environ.get("ROLLOUT_SERVE_URL", "http://127.0.0.1:8000")
FINAL = ("serving", "failed", "retired")


def add_deploy_commands(sub) -> None:
    deploy = sub.add_parser("deploy", help="deploy a checkpoint (full weights or LoRA) to a pool, live",
                            description="Validates the checkpoint, gives it the next policy version and rolls it "
                                        "across the pool's workers without a restart; shows progress until every "
                                        "worker serves it.")
    deploy.add_argument("path", help="Hugging Face checkpoint directory (full weights, or a LoRA adapter), "
                                     "finished (STABLE marker or manifest.json)")
    deploy.add_argument("--pool", help="pool to deploy to (default: the server's pool)")
    deploy.add_argument("--as", dest="kind", choices=["full", "lora"], help="default: what the files are")
    deploy.add_argument("--name", help="model id: a LoRA adapter is served under it (default: the directory name)")
    deploy.add_argument("--mode", choices=["rolling", "all_at_once"], help="full weights: one worker at a time "
                                                                          "(default) or all at once")
    deploy.add_argument("--no-wait", action="store_true", help="return once the deploy has started")
    deploy.set_defaults(func=cmd_deploy)

    listing = sub.add_parser("deployments", help="list the pool's policy versions and their status")
    listing.set_defaults(func=cmd_deployments)

    rollback = sub.add_parser("rollback", help="go back to the version that served before (or --to-version)")
    rollback.add_argument("--to-version", type=int)
    rollback.add_argument("--message", default="", help="why (kept in the deploy history)")
    rollback.add_argument("--pool")
    rollback.set_defaults(func=cmd_rollback)

    for p in (deploy, listing, rollback):
        p.add_argument("--url", default=DEFAULT_URL, help=f"front door URL (default: {DEFAULT_URL})")
        p.add_argument("--api-key", help="admin API key (default: ROLLOUT_SERVE_API_KEY or OPENAI_API_KEY)")


def cmd_deploy(args: argparse.Namespace) -> int:
    body = {"path": str(Path(args.path).expanduser().resolve()), "pool": args.pool, "as": args.kind,
            "name": args.name, "mode": args.mode}
    started = _post(args, "/v1/admin/deployments", {k: v for k, v in body.items() if v is not None})
    if started is None:
        return 1
    print(f"version {started['version']} ({started['kind']}, {started['name']}) registered in pool {started['pool']}",
          file=sys.stderr)
    return 0 if args.no_wait else _follow(args, started["version"])


def cmd_rollback(args: argparse.Namespace) -> int:
    body = {"to_version": args.to_version, "message": args.message, "pool": args.pool}
    started = _post(args, "/v1/admin/deployments/rollback", {k: v for k, v in body.items() if v is not None})
    if started is None:
        return 1
    print(f"rolling back pool {started['pool']} to version {started['version']}", file=sys.stderr)
    return _follow(args, started["version"])


def cmd_deployments(args: argparse.Namespace) -> int:
    listing = _get(args, "/v1/admin/deployments")
    if listing is None:
        return 1
    print(f"{'version':>7}  {'kind':<4}  {'status':<10}  {'name':<24}  path")
    for v in listing["data"]:
        print(f"{v['version']:>7}  {v['kind']:<4}  {v['status']:<10}  {v['name']:<24}  {v['path']}")
    return 0


def _follow(args: argparse.Namespace, version: int) -> int:
    from tqdm import tqdm

    with tqdm(desc=f"deploying version {version}", unit="step", disable=None) as bar:
        while True:
            state = _get(args, f"/v1/admin/deployments/{version}")
            if state is None:
                return 1
            progress = state.get("progress") or {}
            bar.total = progress.get("steps_total") or bar.total
            bar.n = progress.get("steps_done", 0)
            bar.refresh()
            if state["status"] in FINAL and progress.get("status", state["status"]) in FINAL:
                break
            time.sleep(0.5)
    if state["status"] == "failed":
        print(f"version {version} failed: {progress.get('error') or state['events'][-1]['message']}", file=sys.stderr)
        return 1
    took = (progress.get("finished_at") or time.time()) - progress.get("started_at", time.time())
    print(f"version {version} is {state['status']} ({took:.1f}s)")
    return 0


def _headers(args) -> dict:
    key = args.api_key or os.environ.get("ROLLOUT_SERVE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _post(args, path: str, body: dict) -> dict | None:
    return _call(args, "POST", path, body)


def _get(args, path: str) -> dict | None:
    return _call(args, "GET", path, None)


def _call(args, method: str, path: str, body: dict | None) -> dict | None:
    import httpx

    try:
        response = httpx.request(method, f"{args.url}{path}", json=body, headers=_headers(args), timeout=600)
    except httpx.HTTPError as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return None
    answer = response.json()
    if response.status_code >= 400:
        print(f"error {response.status_code}: {answer.get('error', {}).get('message', answer)}", file=sys.stderr)
        return None
    return answer
