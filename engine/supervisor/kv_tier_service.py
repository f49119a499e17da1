"""The tier's processes: mooncake_master (metadata) and a segment holder (the DRAM), on loopback.

    mooncake_master   RPC 127.0.0.1:port_base, metrics and /health on 127.0.0.1:port_base+1
    mooncake_client   holds `capacity_gib` of host memory as the store's one segment; the
                      workers' store clients (segment size 0) put and get objects in it over TCP

Metadata travels by Mooncake's P2P handshake (no etcd, no HTTP metadata server). Every listener
is on loopback: the master's RPC and metrics ports by its flags, the handshake and transfer
listeners (ports picked at run time, bound to every interface by Mooncake 0.3.13 whatever it is
told) by the bind guard each Mooncake process starts with (engine/kv_tier/native.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.kv_tier import native
from engine.kv_tier.settings import KvTierSettings
from engine.supervisor.loopback_http import LOOPBACK
from engine.supervisor.processes import ProcessSpec

# Mooncake's TCP transport binds where we can steer it, and picks its own advertised address.
MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "WARNING"}


def mooncake_env() -> dict[str, str]:
    """The environment of a process that runs Mooncake: its settings, and its wildcard binds kept on loopback."""
    return {**MOONCAKE_ENV, **native.bind_guard_env("127.0.0.1")}


def master_spec(tier: KvTierSettings, run_dir: Path) -> ProcessSpec:
    argv = [
        str(native.binary("mooncake_master")),
        "-rpc_address=127.0.0.1", f"-rpc_port={tier.master_port}",
        "-metrics_host=127.0.0.1", f"-metrics_port={tier.metrics_port}",
        "-http_metadata_server_host=127.0.0.1",  # unused (P2P handshake); keep it off the network anyway
        "-logtostderr",
    ]
    return ProcessSpec("kv-tier-master", argv, {**native.library_path_env(), **mooncake_env()},
                       run_dir / "kv-tier-master.log")


def holder_spec(tier: KvTierSettings, run_dir: Path) -> ProcessSpec:
    argv = [
        str(native.binary("mooncake_client")),
        "-host=127.0.0.1", f"-port={tier.holder_port}",
        f"-master_server_address={tier.master_address}",
        "-metadata_server=P2PHANDSHAKE", "-protocol=tcp",
        f"-global_segment_size={tier.capacity_bytes}",
        "-logtostderr",
    ]
    return ProcessSpec("kv-tier-holder", argv, {**native.library_path_env(), **mooncake_env()},
                       run_dir / "kv-tier-holder.log")


def worker_env() -> dict[str, str]:
    """Environment of a vLLM worker whose connector talks to the tier."""
    return mooncake_env()


@dataclass(frozen=True)
class TierMetrics:
    """What the master reports: capacity mounted by the holder, bytes and objects stored, objects read, objects
    evicted (Mooncake evicts past its high watermark, 90% of the capacity: a tier that has evicted is full) and
    objects whose put was refused (no room at the time)."""

    capacity_bytes: int
    allocated_bytes: int
    keys: int
    get_requests: int
    evicted_keys: int = 0
    put_failures: int = 0

    @classmethod
    def parse(cls, text: str) -> TierMetrics:
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.partition(" ")
                values[name] = float(value)
        gets = values.get("master_batch_get_replica_list_items_total", 0) + values.get(
            "master_get_replica_list_requests_total", 0)
        put_failures = values.get("master_batch_put_start_failed_items_total", 0) + values.get(
            "master_put_start_failures_total", 0)
        return cls(int(values.get("master_total_capacity_bytes", 0)), int(values.get("master_allocated_bytes", 0)),
                   int(values.get("master_key_count", 0)), int(gets), int(values.get("master_evicted_key_count", 0)),
                   int(put_failures))


def read_metrics(tier: KvTierSettings) -> TierMetrics | None:
    try:
        response = LOOPBACK.get(f"http://127.0.0.1:{tier.metrics_port}/metrics", timeout=2.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return TierMetrics.parse(response.text)


def is_ready(tier: KvTierSettings) -> bool:
    """The master answers /health and the holder's segment (the whole capacity) is mounted."""
    try:
        health = LOOPBACK.get(f"http://127.0.0.1:{tier.metrics_port}/health", timeout=2.0).json()
    except (httpx.HTTPError, ValueError):
        return False
    metrics = read_metrics(tier)
    return health.get("status") == "ok" and metrics is not None and metrics.capacity_bytes >= tier.capacity_bytes


def describe_capacity(tier: KvTierSettings, model_dir: Path, block_size: int, dtype: str = "auto") -> str:
    """One line for `rollout-serve up`: the tier's size in tokens of this model's stored blocks."""
    from engine.kv_tier.formats import KvShape, bytes_per_token, tier_capacity_tokens
    from engine.supervisor.compute_dtype import kv_cache_dtype

    shape = KvShape.from_hf_config(model_dir)
    kv_format = "nvfp4" if tier.nvfp4 else kv_cache_dtype(dtype, model_dir)
    tokens = tier_capacity_tokens(tier.capacity_bytes, shape, block_size, kv_format)
    return (f"{tier.capacity_gib:g} GiB of host DRAM = {tokens:,} tokens in {kv_format} blocks "
            f"({bytes_per_token(shape, block_size, kv_format):,.1f} bytes/token; "
            f"bf16 blocks: {tier_capacity_tokens(tier.capacity_bytes, shape, block_size, 'bfloat16'):,}); "
            f"mooncake_master on {tier.master_address}")
