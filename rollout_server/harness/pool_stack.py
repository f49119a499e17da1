"""Stacks with declared pools (a pools file), keys per team, and helpers to send requests to them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from rollout_server.harness.stack import REPO, create_key, free_port_block, start_stack

MODEL = "tiny-qwen2"


def start_pool_stack(tmp: Path, pools_toml: str, deployments: int, teams: tuple[str, ...] = (),
                     limits: dict[str, tuple[str, ...]] | None = None, **kwargs):
    """A stack whose pools file is `pools_toml`; returns it and a key per team (open mode without teams: with
    them, every request needs its team's key). `limits`: team -> `rollout-serve keys limit` options for its key."""
    tmp.mkdir(parents=True, exist_ok=True)
    pools_file = tmp / "pools.toml"
    pools_file.write_text(pools_toml)
    database_url = f"sqlite:///{tmp / 'keys.db'}"
    keys = {team: create_key(database_url, team) for team in teams}
    for team, options in (limits or {}).items():
        done = subprocess.run([sys.executable, "-m", "rollout_server.cli", "keys", "limit", keys[team][:10], *options,
                               "--database-url", database_url], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    pool_ports = free_port_block(40 * deployments, start=31000)  # Dynamo wants its system ports below 32768
    args = ["--pools-file", str(pools_file), "--pool-base-port", str(pool_ports)]
    if teams:
        args += ["--database-url", database_url]
    return start_stack(tmp, extra_args=args, **{"open_mode": not teams, **kwargs}), keys


def auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat(url: str, model: str, key: str | None = None, max_tokens: int = 4, session: str | None = None,
         content: str = "hi", timeout: float = 300) -> httpx.Response:
    headers = {**auth(key), **({"X-Session-ID": session} if session else {})}
    return httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=timeout,
                      json={"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})


def pools(url: str, key: str | None = None) -> dict[str, dict]:
    answer = httpx.get(f"{url}/v1/pools", headers=auth(key), timeout=30)
    assert answer.status_code == 200, answer.text
    return {p["name"]: p for p in answer.json()["data"]}


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


@dataclass
class StreamRecord:
    first_token_at: float | None = None
    status: int | None = None
    tokens: int = 0
    finish_reason: str | None = None
    error: dict | None = None
    done: bool = False
    last_token_at: float | None = None
    left: bool = False  # the client stopped reading (told to by `stop`)


def stream(url: str, model: str, session: str, max_tokens: int, record: StreamRecord,
           deadline_s: float = 240, stop: threading.Event | None = None) -> StreamRecord:
    """A streamed completion (a ~600-token prompt), recorded as it arrives: when its first token came, how it
    ended. Once `stop` is set, the client leaves at the next chunk."""
    body = {"model": model, "prompt": "the quick brown fox " * 150, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    deadline = time.monotonic() + deadline_s
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Session-ID": session},
                      timeout=httpx.Timeout(deadline_s, connect=10)) as resp:
        record.status = resp.status_code
        if resp.status_code != 200:
            record.error = json.loads(resp.read())["error"]
            return record
        for line in resp.iter_lines():
            assert time.monotonic() < deadline, "a stream hung"
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                record.done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record.error = chunk["error"]
                continue
            for choice in chunk["choices"]:
                if choice["text"] and record.first_token_at is None:
                    record.first_token_at = time.monotonic()
                if choice["text"] or choice.get("finish_reason") is None:  # a token (special ones have no text)
                    record.tokens += 1
                    record.last_token_at = time.monotonic()
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
            if stop is not None and stop.is_set():
                record.left = True
                break
    return record


def _cut_by_the_kill(record: StreamRecord) -> bool:
    """Tokens, then the engine's failure: the stream was on the killed worker, which made those tokens before
    it died, even when they reached the client just after the kill (a request arriving at the kill can have
    its first tokens in flight). A stream on a live worker, failed over or not, does not end that way."""
    return record.tokens > 0 and record.error is not None and record.error.get("code") == "service_unavailable"


def completed(record: StreamRecord) -> bool:
    return record.status == 200 and record.done and record.error is None and record.finish_reason == "length"


@dataclass
class KillOutcome:
    not_started: list[StreamRecord]   # had streamed no token when the worker died
    cut: list[StreamRecord]           # were streaming and did not complete
    lost: list[StreamRecord]          # not started, yet did not complete: what failover must prevent
    killed_at: float                  # time.monotonic() of the SIGKILL


# A token that arrives this long after the kill comes from a live worker (one the dead worker sent before
# it died would have arrived long before).
IN_FLIGHT_S = 10


def kill_worker_under_load(url: str, model: str, choose_victim: Callable[[], int], streaming: int = 8,
                           arriving: int = 12, max_tokens: int = 300, streaming_max_tokens: int = 6000) -> KillOutcome:
    """`streaming` requests stream tokens (long ones: they must still be running at the kill), `arriving`
    more are sent, and 0.2 s later the worker process group `choose_victim()` names (asked once the
    streams run, so that it can pick a worker carrying some) is SIGKILLed; returns what happened to each
    request. Long streams still on a live worker 10 s after the kill are left (their client stops reading):
    running them to the end would prove nothing more."""
    started = [StreamRecord() for _ in range(streaming)]
    queued = [StreamRecord() for _ in range(arriving)]
    stop = threading.Event()
    with ThreadPoolExecutor(streaming + arriving) as threads:
        running = [threads.submit(stream, url, model, f"started-{i}", streaming_max_tokens, r, stop=stop)
                   for i, r in enumerate(started)]
        wait_for(lambda: all(r.first_token_at for r in started), 120, "every first stream streaming", poll_s=0.05)
        victim_pid = choose_victim()
        waiting = [threads.submit(stream, url, model, f"queued-{i}", max_tokens, r) for i, r in enumerate(queued)]
        time.sleep(0.2)        # the new requests are in the front door, in Dynamo, or prefilling
        killed_at = time.monotonic()
        os.killpg(victim_pid, signal.SIGKILL)
        for future in waiting:
            future.result(timeout=300)
        # Every stream but those still getting tokens from a live worker has ended, cut or complete.
        wait_for(lambda: all(f.done() or r.last_token_at > killed_at + IN_FLIGHT_S for f, r in zip(running, started)),
                 240, "every stream on the killed worker ended")
        stop.set()
        for future in running:
            future.result(timeout=60)
    records = started + queued
    not_started = [r for r in records if r.first_token_at is None
                   or (r.first_token_at > killed_at and not _cut_by_the_kill(r))]
    cut = [r for r in records if r not in not_started and not completed(r) and not r.left]
    return KillOutcome(not_started, cut, [r for r in not_started if not completed(r)], killed_at)
