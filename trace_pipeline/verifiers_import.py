"""Imports verifiers `traces.jsonl` runs into a trace store.

The shape is read leniently (verifiers 0.4 results; fields we do not know are ignored):

    one JSON object per line: an Episode holding a `trace` (object) or `traces` (list),
    or a Trace itself. Episode or trace ids: `id` | `episode_id` | `example_id` | `trace_id`.
    Trace: {tools?, nodes: [...], reward?, rewards?, metrics?, advantage?, timing?}
    Node:  {message: {role, content, tool_calls?, ...} (or the node itself is the message),
            sampled?: bool (default: role == "assistant"),
            token_ids? (or tokens), mask? (default all 1 when sampled), logprobs?}

Each sampled node becomes one TraceRecord: its prompt is the token ids (and
messages) of every node before it, its completion the node's own tokens with their
mask and logprobs (missing logprobs -> 0.0). Export then stitches these turns back
into the trajectory, so an rl export reproduces the node tokens exactly. Nodes after
the last sampled node carry no training signal and are not stored.

Rewards become one session-level reward row: reward = the episode's or trace's
`reward` (or `rewards` when that is a number); a `rewards` dict of named rewards
and the `metrics` dict become metrics. `advantage` is taken when present.
Importing the same file twice stores its traces twice.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from trace_pipeline import codec
from trace_pipeline.records import RewardRecord, TraceRecord
from trace_pipeline.redact import redact_record
from trace_pipeline.store import TraceStore

log = logging.getLogger(__name__)

ID_KEYS = ("id", "episode_id", "example_id", "trace_id")


def import_verifiers(store: TraceStore | Path | str, traces_jsonl: Path | str, team: str, model: str, *,
                     policy_version: int = 0, redact: bool = True) -> int:
    """Stores every sampled node of every trace in traces_jsonl (into a store, or the store in a directory);
    returns records stored."""
    if not isinstance(store, TraceStore):
        store = TraceStore(store)
    records: list[TraceRecord] = []
    rewards: list[RewardRecord] = []
    now = time.time()
    with open(traces_jsonl) as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            episode = json.loads(line)
            traces = episode_traces(episode)
            for k, trace in enumerate(traces):
                session_id = f"vf-{first_id(episode, trace) or f'line{line_no}'}"
                if len(traces) > 1:
                    session_id += f"-{k}"
                created_at = now + len(records) * 1e-6   # keeps node order for stitching
                turns = trace_records(trace, session_id, team, model, policy_version, created_at)
                records.extend(redact_record(r) if redact else r for r in turns)
                reward = reward_row(episode, trace, session_id, team, now)
                if turns and reward is not None:
                    rewards.append(reward)
    if records:   # through the WAL like captured records: a crash mid-import recovers
        segment = store.new_segment(prefix="import")
        segment.append([codec.encode(r) for r in records])
        segment.close()
        store.seal(segment.path, records)
    if rewards:
        store.append_rewards(rewards)
    store.close()
    log.info("imported %d records and %d reward rows from %s for team %s",
             len(records), len(rewards), traces_jsonl, team)
    return len(records)


def episode_traces(episode: dict) -> list[dict]:
    if isinstance(episode.get("traces"), list):
        return episode["traces"]
    if isinstance(episode.get("trace"), dict):
        return [episode["trace"]]
    if "nodes" in episode:
        return [episode]
    raise ValueError(f"no trace in verifiers record (keys: {sorted(episode)})")


def first_id(*objects: dict) -> str | None:
    for obj in objects:
        for key in ID_KEYS:
            if obj.get(key) is not None:
                return str(obj[key])
    return None


def trace_records(trace: dict, session_id: str, team: str, model: str, policy_version: int,
                  created_at: float) -> list[TraceRecord]:
    records = []
    context_tokens: list[int] = []
    context_messages: list[dict] = []
    for index, node in enumerate(trace["nodes"]):
        message = node.get("message") or {k: node[k] for k in ("role", "content", "tool_calls",
                                                                 "tool_call_id", "name") if k in node}
        tokens = list(node.get("token_ids") or node.get("tokens") or [])
        if node.get("sampled", message.get("role") == "assistant"):
            records.append(sampled_record(node, message, tokens, context_tokens, context_messages,
                                          trace, f"{session_id}-n{index}", session_id, team,
                                          model, policy_version, created_at + index * 1e-7))
        context_tokens += tokens
        context_messages.append(message)
    return records


def sampled_record(node, message, tokens, context_tokens, context_messages, trace, request_id,
                   session_id, team, model, policy_version, created_at) -> TraceRecord:
    mask = node.get("mask")
    if mask is not None and len(mask) != len(tokens):
        log.warning("%s: mask has %d entries for %d tokens; treating all tokens as sampled",
                    request_id, len(mask), len(tokens))
        mask = None
    logprobs = [0.0 if lp is None else float(lp) for lp in (node.get("logprobs") or [])]
    return TraceRecord(
        request_id=request_id, session_id=session_id, team=team, model=model,
        policy_version=policy_version, endpoint="chat.completions", created_at=created_at,
        request_messages=list(context_messages), tools=trace.get("tools"), prompt_text=None,
        output_message=message, output_text=None, sampling_params={},
        prompt_token_ids=list(context_tokens), completion_token_ids=tokens,
        completion_logprobs=logprobs + [0.0] * (len(tokens) - len(logprobs)),
        finish_reason=None, queue_ms=None, ttft_ms=None, inter_token_ms=[], total_ms=0.0,
        cached_tokens=0, worker_ids=[],
        completion_mask=None if mask is None or all(m == 1 for m in mask) else [int(m) for m in mask],
        source="verifiers")


def reward_row(episode: dict, trace: dict, session_id: str, team: str, now: float) -> RewardRecord | None:
    reward = episode.get("reward", trace.get("reward"))
    named = trace.get("rewards", episode.get("rewards"))
    if reward is None and isinstance(named, (int, float)):
        reward = named
    metrics = {}
    for source in (named if isinstance(named, dict) else {}, episode.get("metrics") or {},
                   trace.get("metrics") or {}):
        metrics.update({k: float(v) for k, v in source.items() if isinstance(v, (int, float))})
    advantage = episode.get("advantage", trace.get("advantage"))
    if reward is None and advantage is None and not metrics:
        return None
    return RewardRecord(reward_id=f"rwd-{uuid.uuid4().hex}", team=team, created_at=now,
                        session_id=session_id, reward=None if reward is None else float(reward),
                        advantage=None if advantage is None else float(advantage), metrics=metrics)
