"""The ids every layer passes around, each with one type and one representation end to end.

- `WorkerId`: the Dynamo instance id of a worker (a 64-bit integer). Dynamo's router reports it as an
  integer, its metrics page as hex; both are read into this one integer. It leaves the process as decimal
  text (the `x-worker-id` header, the `worker_id` response field, trace records).
- `SessionId`: what keeps a conversation on the worker that holds its KV (engine/sessions.py). Any text.
- `PoolName`: a capacity pool (engine/supervisor/pool_config.py). `DEFAULT_POOL` is the stack's own workers.
- `PolicyVersion`: the number of the weights that produce tokens. The base model is `BASE_VERSION`; every
  registered checkpoint gets the next number (finetune_deploy/registry.py); numbers are never reused.
- `RequestId`: one request through the engine (several choices share it).
"""

from __future__ import annotations

import secrets
from typing import NewType

WorkerId = NewType("WorkerId", int)
SessionId = NewType("SessionId", str)
PoolName = NewType("PoolName", str)
PolicyVersion = NewType("PolicyVersion", int)
RequestId = NewType("RequestId", str)

DEFAULT_POOL = PoolName("default")
BASE_VERSION = PolicyVersion(0)


def worker_id_from_hex(text: str) -> WorkerId:
    """A worker id as Dynamo's metrics label writes it (`worker_id="1a2b..."`)."""
    return WorkerId(int(text, 16))


def random_hex() -> str:
    """128 random bits as 32 hex digits (what uuid4().hex carries, without building a UUID)."""
    return secrets.token_hex(16)


def new_request_id(prefix: str) -> RequestId:
    return RequestId(f"{prefix}-{random_hex()}")
