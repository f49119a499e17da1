"""Session affinity: a conversation's turns go to the worker that holds its KV.

The rules, in the order a request meets them:
1. A request's session is its `X-Session-ID` header, else the body's `session_id` (vLLM's field), else the
   OpenAI `user`, else a session of its own (`session_id_for`).
2. Among a pool's deployments, a session always lands on the same slot (`deployment_slot`: a stable hash, so
   a restarted front door still finds the deployment that holds the KV).
3. Within a deployment, a session stays on the worker of its first turn while that worker serves it and the
   session is not idle for `session_affinity_ttl_s`:
   - through Dynamo's frontend, Dynamo's router keeps the binding, told by `x-dynamo-session-id`
     (`dynamo_session_header`, `frontend_affinity_args`);
   - through the router inside the front door, which reads no session of its own, `SessionPins` keeps it.
   A worker that refuses a session's request loses the pin: the retry is placed afresh.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict

from engine.http_headers import header_value
from engine.ids import SessionId, WorkerId, random_hex

DYNAMO_SESSION_HEADER = "x-dynamo-session-id"
_DYNAMO_SESSION_HEADER_MAX = 256  # characters Dynamo's frontend accepts in the header


def session_id_for(header: str | None, session_field: str | None, user: str | None) -> SessionId:
    return SessionId(header or session_field or user or f"sess-{random_hex()}")


def deployment_slot(session_id: str | None, slots: int) -> int:
    """Which of `slots` deployments a session goes to."""
    return zlib.crc32((session_id or "").encode()) % slots


def dynamo_session_header(session_id: str | None) -> dict[str, str]:
    """The header that binds a request's session to a worker in Dynamo's router (none without a session)."""
    return {DYNAMO_SESSION_HEADER: header_value(session_id)[:_DYNAMO_SESSION_HEADER_MAX]} if session_id else {}


def frontend_affinity_args(ttl_s: float) -> list[str]:
    """Dynamo frontend flags that keep a session (named by `DYNAMO_SESSION_HEADER`) on its worker."""
    return ["--router-session-affinity-ttl-secs", str(ttl_s), "--router-session-affinity-mode", "soft"]


class SessionPins:
    """Session -> the worker that holds its KV, forgotten after `ttl_s` without a turn, or sooner when more than
    `most` sessions are pinned (least recently used first: every request without a session has one of its own)."""

    def __init__(self, ttl_s: float, most: int = 200_000):
        self.ttl_s = ttl_s
        self.most = most
        self._pins: OrderedDict[str, tuple[WorkerId, float]] = OrderedDict()  # least recently used first

    def worker_of(self, session_id: str | None) -> WorkerId | None:
        self._forget_idle()
        pin = self._pins.get(session_id) if session_id else None
        return pin[0] if pin else None

    def pin(self, session_id: str | None, worker_id: WorkerId) -> None:
        if session_id:
            self._pins[session_id] = (worker_id, time.monotonic())
            self._pins.move_to_end(session_id)
            if len(self._pins) > self.most:
                self._pins.popitem(last=False)

    def unpin(self, session_id: str | None) -> None:
        self._pins.pop(session_id, None)

    def _forget_idle(self) -> None:
        now = time.monotonic()
        while self._pins and now - next(iter(self._pins.values()))[1] > self.ttl_s:
            self._pins.popitem(last=False)
