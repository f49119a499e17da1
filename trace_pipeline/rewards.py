"""Attaching rewards to traces (append-only, team-checked) and joining them at export.

Join rule: for a trace, reward rows of its session apply first, then rows of each
turn from the trajectory's root down to the trace itself, each target's rows oldest
first; a later row overrides reward / advantage (when it sets them) and metric
names it repeats. So the most specific, newest value wins.
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from trace_pipeline.records import RewardRecord
from trace_pipeline.store import TraceStore

log = logging.getLogger(__name__)


class RewardError(Exception):
    """A rejected reward: index of the item, the offending field, a code, HTTP status."""
    status = 400
    code = "invalid_reward"

    def __init__(self, index: int, param: str, message: str):
        super().__init__(message)
        self.index, self.param, self.message = index, param, message


class InvalidReward(RewardError):
    pass


class TraceNotFound(RewardError):
    status, code = 404, "trace_not_found"


class TraceNotOwned(RewardError):
    status, code = 403, "trace_not_owned"


@dataclass
class RewardInput:
    request_id: str | None = None
    session_id: str | None = None
    choice_index: int | None = None
    reward: float | None = None
    advantage: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def attach_rewards(store: TraceStore, team: str, items: list[RewardInput]) -> list[RewardRecord]:
    """Checks every item (all or nothing), then appends them durably. Returns the stored rows."""
    for index, item in enumerate(items):
        _validate(index, item)
        _authorize(store, team, index, item)
    now = time.time()
    rows = [RewardRecord(reward_id=f"rwd-{uuid.uuid4().hex}", team=team, created_at=now,
                         request_id=item.request_id, session_id=item.session_id,
                         choice_index=item.choice_index, reward=item.reward,
                         advantage=item.advantage, metrics=dict(item.metrics))
            for item in items]
    store.append_rewards(rows)
    log.info("attached %d reward row(s) for team %s", len(rows), team)
    return rows


def _validate(index: int, item: RewardInput) -> None:
    if (item.request_id is None) == (item.session_id is None):
        raise InvalidReward(index, "request_id", "give exactly one of request_id or session_id")
    if item.session_id is not None and item.choice_index is not None:
        raise InvalidReward(index, "choice_index", "choice_index only applies to a request_id")
    if item.reward is None and item.advantage is None and not item.metrics:
        raise InvalidReward(index, "reward", "give at least one of reward, advantage, metrics")
    values = {"reward": item.reward, "advantage": item.advantage,
              **{f"metrics.{k}": v for k, v in item.metrics.items()}}
    for name, value in values.items():
        if value is not None and not math.isfinite(value):
            raise InvalidReward(index, name, f"{name} must be a finite number")


def _authorize(store: TraceStore, team: str, index: int, item: RewardInput) -> None:
    if item.request_id is not None:
        param, value, teams = "request_id", item.request_id, store.teams_of_request(item.request_id)
    else:
        param, value, teams = "session_id", item.session_id, store.teams_of_session(item.session_id)
    if not teams:
        raise TraceNotFound(index, param, f"no trace with {param} {value!r}")
    if team not in teams:
        raise TraceNotOwned(index, param, f"{param} {value!r} belongs to another team")
    if item.choice_index is not None and item.choice_index not in (choices := store.choices_of_request(value)):
        raise TraceNotFound(index, "choice_index",
                            f"request {value!r} has no choice {item.choice_index}; its choices: {sorted(choices)}")


@dataclass
class JoinedReward:
    reward: float | None
    advantage: float | None
    metrics: dict[str, float]


class RewardBook:
    """The reward rows of one team, indexed for the export join."""

    def __init__(self, rows: list[RewardRecord]):
        self._by_request: dict[str, list[RewardRecord]] = defaultdict(list)
        self._by_session: dict[str, list[RewardRecord]] = defaultdict(list)
        for row in sorted(rows, key=lambda r: r.created_at):
            if row.request_id is not None:
                self._by_request[row.request_id].append(row)
            else:
                self._by_session[row.session_id].append(row)

    def join(self, session_id: str, turns: list[tuple[str, int]]) -> JoinedReward:
        """turns: (request_id, choice_index) from the trajectory's root down to the trace."""
        layers = [self._by_session.get(session_id, [])]
        for request_id, choice_index in turns:
            layers.append([r for r in self._by_request.get(request_id, [])
                           if r.choice_index is None or r.choice_index == choice_index])
        joined = JoinedReward(None, None, {})
        for rows in layers:
            for row in rows:
                if row.reward is not None:
                    joined.reward = row.reward
                if row.advantage is not None:
                    joined.advantage = row.advantage
                joined.metrics.update(row.metrics)
        return joined
