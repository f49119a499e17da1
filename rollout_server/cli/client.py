"""`rollout-serve chat | status | pools`: commands that talk to a running front door."""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

DEFAULT_URL = os.environ.get("ROLLOUT_SERVE_URL", "http://127.0.0.1:8000")


def add_client_commands(sub: argparse._SubParsersAction) -> None:
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


def _client_headers(args) -> dict:
    key = args.api_key or os.environ.get("ROLLOUT_SERVE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def cmd_chat(args: argparse.Namespace) -> int:
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
    print(f"{'worker':>6}  {'role':>10}  {'pid':>8}  {'healthy':>7}  {'in flight':>9}  {'version':>7}  {'paused':>6}  "
          "instance id")
    for w in status["workers"]:
        print(f"{w['worker']:>6}  {w.get('role', '-'):>10}  {w['pid'] or '-':>8}  {str(w['healthy']):>7}  "
              f"{'-' if w['inflight_requests'] is None else format(w['inflight_requests'], '.0f'):>9}  "
              f"{w.get('policy_version', '-'):>7}  {str(w.get('paused', False)):>6}  {w['instance_id'] or '-'}")
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
