"""A vLLM general plugin: NIXL agents without their busy-polling progress thread (CPU workers).

vLLM loads general plugins (entry point group `vllm.general_plugins`, pyproject.toml) in every
process it starts, before a worker builds its KV connector. NIXL's Python wrapper always gives its
UCX progress thread a 0 µs poll timeout, so the thread spins on a core even when nothing moves; on a
machine where a decode worker has one core, it takes a large share of that core from the engine and
slows every decode step (docs/benchmarks.md, "Measurements behind design choices").
Without the thread, transfers still complete: NIXL progresses UCX whenever vLLM checks a transfer's
state (decode side, every step) or asks for notifications (prefill side, every step); NIXL tests this
mode itself (`ucx_no_pt`).

Active only where the stack asks for it (worker environment ROLLOUT_SERVE_NIXL_PROGRESS_THREAD=off,
engine/supervisor/disaggregation.py sets it for CPU workers).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

SWITCH = "ROLLOUT_SERVE_NIXL_PROGRESS_THREAD"


def register() -> None:
    if os.environ.get(SWITCH, "on") != "off":
        return
    # vLLM sets this before it imports NIXL itself; importing NIXL here first would skip that.
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    try:
        from nixl import _api
    except ImportError:
        return
    bindings = _api.nixlBind
    if getattr(bindings.nixlAgent, "_without_progress_thread", False):
        return  # plugins may load more than once per process
    build_agent = bindings.nixlAgent

    def agent_without_progress_thread(name, config):
        config.useProgThread = False  # the agent copies its config: set it before building
        return build_agent(name, config)

    agent_without_progress_thread._without_progress_thread = True
    bindings.nixlAgent = agent_without_progress_thread
    log.info("NIXL agents in this process run without a progress thread (UCX progresses on each check)")
