"""Stacks with declared pools (a pools file), keys per team, and helpers to send requests to them."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.sessions import deployment_slot
from rollout_server.auth import OPEN_MODE_TEAM
from rollout_server.harness.stack import REPO, RunningStack, create_key, free_port_block, start_stack
from rollout_server.serving.team_scope import team_scoped

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
    worker: str | None = None  # `x-worker-id`: the worker that made its first output
    request_id: str | None = None  # `x-request-id`


def stream(url: str, model: str, session: str, max_tokens: int, record: StreamRecord,
           deadline_s: float = 240, stop: threading.Event | None = None, prompt: str = "") -> StreamRecord:
    """A streamed completion (`prompt`, then ~600 tokens of the same words every time), recorded as it arrives:
    when its first token came, how it ended. Once `stop` is set, the client leaves at the next chunk."""
    body = {"model": model, "prompt": prompt + "the quick brown fox " * 150, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    deadline = time.monotonic() + deadline_s
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Session-ID": session},
                      timeout=httpx.Timeout(deadline_s, connect=10)) as resp:
        record.status = resp.status_code
        record.worker, record.request_id = resp.headers.get("x-worker-id"), resp.headers.get("x-request-id")
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


def deployment_of(session: str, deployments: list[str], team: str = OPEN_MODE_TEAM) -> str:
    """The deployment the front door sends a request of `session` (from `team`) to, while every one of
    `deployments` (a pool's, in the order /v1/pools lists them) is in rotation and none has refused the request:
    the front door's own rule (`PoolSet.pick`), `deployment_slot` of the session as the engine sees it, scoped
    by its team (`team_scoped`)."""
    return deployments[deployment_slot(team_scoped(team, session), len(deployments))]


def sessions_routed_to(deployment: str, deployments: list[str], count: int, prefix: str) -> list[str]:
    """`count` session names (`prefix`-0, `prefix`-1, ...) whose requests the front door sends to `deployment`."""
    names = (f"{prefix}-{k}" for k in itertools.count())
    return list(itertools.islice((s for s in names if deployment_of(s, deployments) == deployment), count))


@dataclass
class KillOutcome:
    """What happened to the requests sent to the killed worker's deployment (the victim). The figures count
    those alone: a request the front door sent to another deployment never met the kill."""
    victim: str                       # the deployment whose worker was killed ("ha/0")
    victim_pid: int                   # the killed worker's process group
    on_victim: list[StreamRecord]     # every request the front door sent to the victim
    not_started: list[StreamRecord]   # of those, had streamed no token when the worker died
    cut: list[StreamRecord]           # of those, were streaming and did not complete
    lost: list[StreamRecord]          # not started, yet did not complete: what failover must prevent
    failed_elsewhere: list[StreamRecord]  # on another deployment, yet neither completed nor left: must be none
    failovers: int                    # requests the front door moved to another deployment meanwhile (/v1/pools)
    killed_at: float                  # time.monotonic() of the SIGKILL


# A token that arrives this long after the kill comes from a live worker (one the dead worker sent before
# it died would have arrived long before).
IN_FLIGHT_S = 10


def refused_by(log_text: str, request_id: str, deployment: str) -> bool:
    """Whether the front door's log says `deployment` refused the request (client id `request_id`) before any
    output: engine/client/dispatch.py logs each refusal, naming the request by its team-scoped id."""
    return bool(re.search(rf"request \S*{re.escape(request_id)}(: {re.escape(deployment)} refused it"
                          rf"| refused by {re.escape(deployment)} )", log_text))


def kill_worker_under_load(stack: RunningStack, model: str, victim: str | None = None, streaming: int = 8,
                           arriving: int = 12, max_tokens: int = 300, streaming_max_tokens: int = 6000) -> KillOutcome:
    """`streaming` requests stream tokens (long ones: they must still be running at the kill), spread evenly over
    the pool's deployments; then `arriving` more are sent, all under sessions the front door routes to the
    `victim` deployment (default: the pool's first), whose worker process group is frozen first (SIGSTOP) and
    SIGKILLed once the front door has sent them there; returns what happened to each request sent to the victim.
    Long streams still on a live worker 10 s after the kill are left (their client stops reading): running them
    to the end would prove nothing more.

    Which deployment a request went to is a fact of each request, from the real path: the streams' sessions are
    checked against the front door's count of requests in flight per deployment (/v1/pools), and name the
    victim's worker (`x-worker-id`). A new request went to the victim when the victim's worker served it (it
    completed, or was cut, there) or when the front door's log says the victim refused it (it failed over).
    One the front door sent straight to another deployment (the victim already out of rotation) did not; one
    that failed without a token counts where its session routes, so that no loss drops out of the figures."""
    url, pool = stack.url, model.partition("@")[2]

    def deployments() -> dict[str, dict]:
        return {d["name"]: d for d in pools(url)[pool]["deployments"]}

    names = list(deployments())
    assert all(d["healthy"] for d in deployments().values()), f"{pool}: a deployment is out of rotation"
    victim = victim or names[0]
    per_deployment = {name: sessions_routed_to(name, names, streaming, "started") for name in names}
    stream_sessions = [per_deployment[names[i % len(names)]][i // len(names)] for i in range(streaming)]
    arriving_sessions = sessions_routed_to(victim, names, arriving, "queued")
    streams_on_victim = sum(deployment_of(s, names) == victim for s in stream_sessions)

    started = [StreamRecord() for _ in stream_sessions]
    queued = [StreamRecord() for _ in arriving_sessions]
    stop = threading.Event()
    in_flight_before = deployments()[victim]["in_flight"]
    failovers_before = pools(url)[pool]["failovers"]
    with ThreadPoolExecutor(streaming + arriving) as threads:
        running = [threads.submit(stream, url, model, s, streaming_max_tokens, r, stop=stop)
                   for s, r in zip(stream_sessions, started)]
        wait_for(lambda: all(r.first_token_at for r in started), 120, "every first stream streaming", poll_s=0.05)
        in_flight = deployments()[victim]["in_flight"] - in_flight_before
        assert in_flight == streams_on_victim, (
            f"{victim} has {in_flight} of the streams, not the {streams_on_victim} whose sessions route there: the "
            "routing rule here is not the front door's")
        # Each deployment has one worker: the streams name the victim's, and no other stream was served by it.
        victim_workers = {r.worker for s, r in zip(stream_sessions, started) if deployment_of(s, names) == victim}
        other_workers = {r.worker for s, r in zip(stream_sessions, started) if deployment_of(s, names) != victim}
        assert len(victim_workers) == 1 and not victim_workers & other_workers, (victim_workers, other_workers)
        victim_pid = deployments()[victim]["worker_pids"][0]
        # The victim is frozen (SIGSTOP) before the new requests are sent, and killed once the front door has sent
        # them there: so they reach a worker that dies before their first token, whatever the machine's speed.
        # (A fixed pause before the kill was too short on a cold front door, the requests then went elsewhere,
        # and too long on a busy machine, where a live victim had streamed their first tokens by then.) The
        # front door keeps a frozen deployment in rotation for two missed checks, longer than this takes.
        os.killpg(victim_pid, signal.SIGSTOP)
        try:
            # Each new prompt starts with its own words: no prefix of it is cached, so it takes a real prefill.
            waiting = [threads.submit(stream, url, model, s, max_tokens, r, prompt=f"{s}: ")
                       for s, r in zip(arriving_sessions, queued)]
            dispatched = in_flight_before + streams_on_victim + arriving
            deadline = time.monotonic() + 10
            while deployments()[victim]["in_flight"] < dispatched and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
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
    log_text = stack.log_path.read_text(errors="replace")

    def went_to_victim(session: str, record: StreamRecord) -> bool:
        if record.worker in victim_workers or (record.request_id and refused_by(log_text, record.request_id, victim)):
            return True
        failed_without_output = record.tokens == 0 and not completed(record)
        return failed_without_output and deployment_of(session, names) == victim

    sent = list(zip(stream_sessions + arriving_sessions, started + queued))
    on_victim = [r for s, r in sent if went_to_victim(s, r)]
    elsewhere = [r for s, r in sent if not went_to_victim(s, r)]
    not_started = [r for r in on_victim if r.first_token_at is None
                   or (r.first_token_at > killed_at and not _cut_by_the_kill(r))]
    cut = [r for r in on_victim if r not in not_started and not completed(r) and not r.left]
    return KillOutcome(victim, victim_pid, on_victim, not_started, cut, [r for r in not_started if not completed(r)],
                       [r for r in elsewhere if not completed(r) and not r.left],
                       pools(url)[pool]["failovers"] - failovers_before, killed_at)
