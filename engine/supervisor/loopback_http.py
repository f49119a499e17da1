"""The one HTTP client for the stack's probes of its own processes (health, metrics, model lists).

`httpx.get` builds a new client per call, and with it a TLS context that loads the CA bundle each time.
The pool supervisor probes every worker and frontend every second, in the front door's process, so a
client per call would cost the front door CPU on every probe (docs/benchmarks.md, "Measurements behind
design choices"). This client is built once. It keeps no connections alive: a restarted worker on the same
port must not meet a stale connection.
"""

from __future__ import annotations

import httpx

LOOPBACK = httpx.Client(timeout=2.0, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))
