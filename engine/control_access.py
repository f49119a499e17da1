"""Who may call a worker's admin routes (pause, load weights, LoRA, ...): the front door alone.

Shared by the supervisor (which starts each worker with its control socket and its deployment's token), the
front door's client of those routes (engine/supervisor/worker_control.py) and the worker, which serves them
(engine/worker/control_socket.py). Two locks, each enough against a different caller:
- the routes are served on a Unix socket in a directory only the front door's user can enter (0700), not on a
  TCP port: another local user cannot connect at all;
- every call carries the deployment's token, a random secret made when the deployment starts and handed to
  its workers through their environment (never a command line, which `ps` shows to every user); a call
  without it is refused (401), so a process that can reach the socket (one running as the same user through
  a loosened directory) still cannot drive the worker.
"""

from __future__ import annotations

import hmac
import secrets

SOCKET_ENV = "ROLLOUT_SERVE_CONTROL_SOCKET"  # the socket's path
TOKEN_ENV = "ROLLOUT_SERVE_CONTROL_TOKEN"    # the deployment's token; the worker removes it from its environment
SCHEME = "Bearer"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def authorization(token: str) -> str:
    """The `Authorization` header value of a call carrying `token`."""
    return f"{SCHEME} {token}"


def allowed(header: str | None, token: str) -> bool:
    """Whether an `Authorization` header carries `token` (compared in constant time)."""
    return hmac.compare_digest((header or "").encode(), authorization(token).encode())
