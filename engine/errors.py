"""What the engine raises when it cannot serve a request.

The engine speaks no HTTP: each error says what happened, and the front door decides what the client sees
(rollout_server/errors.py, `from_engine`). Every message is written for the client to read.

Rules:
- `EngineUnavailable`: no engine took or finished the request now; the same request may succeed later.
- `EngineTimeout`: the engine sent nothing for the request timeout.
- `RequestRejected`: the engine refused the request itself (`status`: Dynamo's 4xx); sending it again is
  pointless. `ContextLengthExceeded` is the one refusal the front door words itself.
- `RefusedBeforeOutput` wraps any of them when nothing was generated yet: only then may a caller send the
  request again, to the same deployment or another (engine/client/dispatch.py).
"""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class EngineUnavailable(EngineError):
    pass


class EngineTimeout(EngineError):
    pass


class RequestRejected(EngineError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ContextLengthExceeded(RequestRejected):
    """The prompt and max_tokens together exceed the worker's context window of `limit` tokens."""

    def __init__(self, limit: int | None, requested: int | None, message: str):
        super().__init__(400, message)
        self.limit = limit
        self.requested = requested


class RefusedBeforeOutput(Exception):
    """The request never reached a worker, or failed before its first token: nothing was generated."""

    def __init__(self, error: EngineError):
        super().__init__(error.message)
        self.error = error


def error_from_dynamo(status: int, body: dict, model: str) -> EngineError:
    """Dynamo's error answer (an HTTP status and its JSON body, on either path to a worker) as an engine error."""
    details = body.get("details") or {}
    message = body.get("message") or body.get("error") or "engine error"
    if details.get("type") == "context_length":
        return ContextLengthExceeded(details.get("limit"), details.get("actual"), str(message))
    if status == 404:
        # The front door checked the model; Dynamo forgets a model when its last worker goes away.
        return EngineUnavailable(f"no worker is serving {model} right now ({message}); retry shortly")
    if 400 <= status < 500:
        return RequestRejected(status, str(message))
    return EngineUnavailable(f"the engine could not serve the request: {message}")
