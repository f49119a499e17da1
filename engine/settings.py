"""Settings of the engine: the model it serves, its workers, their routing, pools, LoRA and the KV tier.

rollout_server/settings.py nests `EngineSettings` as `engine`; each field is also a `rollout-serve up` flag
of the same name (`--workers`), and an environment variable (ROLLOUT_SERVE_ENGINE__WORKERS, or the short
ROLLOUT_SERVE_WORKERS; sections: ROLLOUT_SERVE_KV_TIER__ENABLED).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, IPvAnyAddress, model_validator

from engine.kv_tier.settings import KvTierSettings

# Measured by benchmarks/agentic.py and benchmarks/frontdoor.py (docs/benchmarks.md).
DISAGG_LOCAL_MAX_UNCACHED_TOKENS = 512
DISAGG_LOCAL_MIN_CACHED_FRACTION = 0.5
PREFILL_BUDGET_TOKENS = 8192
UNSTREAMED_INTERVAL = 16


class DisaggregationSettings(BaseModel):
    """Prefill/decode disaggregation (engine/supervisor/disaggregation.py): both counts > 0 replace `workers`."""

    prefill_workers: int = Field(0, ge=0, description="prefill-only vLLM workers; with decode_workers, serve "
                                                      "disaggregated (KV moves over NIXL); 0: aggregated workers. "
                                                      "Cluster mode: both > 0 say the cluster's workers are "
                                                      "prefill and decode workers (they join on their own)")
    decode_workers: int = Field(0, ge=0, description="decode-only vLLM workers (with prefill_workers)")
    nixl_side_channel_base_port: int = Field(19080, description="NIXL handshake port of worker 0 in disaggregated "
                                                                "serving; worker i uses base + i")
    disagg_local_max_uncached_tokens: int = Field(
        DISAGG_LOCAL_MAX_UNCACHED_TOKENS, ge=0,
        description="conditional disaggregation: a request is prefilled on its decode worker when fewer prompt "
                    "tokens than this are uncached there AND disagg_local_min_cached_fraction is met (0: always "
                    "prefill remotely)")
    disagg_local_min_cached_fraction: float = Field(
        DISAGG_LOCAL_MIN_CACHED_FRACTION, ge=0.0, le=1.0,
        description="conditional disaggregation: ... AND more than this fraction of the prompt is cached on the "
                    "decode worker")
    disagg_local_when_prefill_busy: float | None = Field(
        None, ge=0.0,
        description="conditional disaggregation, load-aware: a request is also prefilled on its decode worker when "
                    "every prefill worker holds more pending prefill tokens than this fraction of its budget "
                    "(prefill_budget_tokens), unless the decode worker is busy (Dynamo's isl_or_load policy); "
                    "None: by prompt length alone")
    prefill_budget_tokens: int = Field(PREFILL_BUDGET_TOKENS, ge=256,
                                       description="per-step prefill token budget of prefill workers (longer prompts "
                                                   "are prefilled in chunks of this size)")
    nixl_progress_thread: bool = Field(
        False, description="CPU workers: keep NIXL's UCX progress thread (it busy-polls the worker's core; "
                           "without it UCX progresses whenever vLLM checks a transfer). GPU workers always keep it")
    ucx_transports: str | None = Field(
        None, description="the UCX transports NIXL may move KV over (UCX_TLS, e.g. tcp; rc,ud for InfiniBand); "
                          "default: UCX chooses (between hosts: the network; on one host also shared memory)")
    kv_layout: Literal["BLHNC", "LBHNC"] = Field(
        "BLHNC",
        description="KV cache layout of prefill and decode workers: BLHNC (block-major: a block of every layer is "
                    "one NIXL descriptor, engine/worker/block_major_kv.py) or LBHNC (vLLM's layer-major default: "
                    "one descriptor per layer and block)")
    disagg_kv_lease_s: int = Field(
        300, ge=10,
        description="how long a prefill worker keeps a request's KV for its decode worker to read (vLLM's "
                    "kv_lease_duration; its 30 s default expires on a loaded CPU machine and the decode worker "
                    "then reads freed blocks)")

    @property
    def enabled(self) -> bool:
        return self.prefill_workers > 0 and self.decode_workers > 0

    @model_validator(mode="after")
    def _both_roles(self) -> DisaggregationSettings:
        if (self.prefill_workers > 0) != (self.decode_workers > 0):
            raise ValueError("prefill_workers and decode_workers go together: set both (disaggregated) or neither")
        return self


class PoolSettings(BaseModel):
    """Capacity pools and failover (engine/supervisor/pools.py, docs/pools.md)."""

    pools_file: Path | None = Field(None, description="TOML file declaring serverless and reserved pools (see "
                                                      "docs/pools.md); the stack's own workers are the default pool")
    pool_base_port: int = Field(21000, lt=32768 - 40, description="first port of the pools' deployments (40 ports "
                                                                  "each; Dynamo's system ports must be below 32768)")
    pool_check_interval_s: float = Field(1.0, gt=0, description="how often every deployment's health is checked "
                                                                "(unhealthy: out of rotation)")
    restart_dead_workers: bool = Field(True, description="start again a worker or frontend process that died "
                                                         "(not for disaggregated workers)")


class LoraSettings(BaseModel):
    enable_lora: bool = Field(
        False, description="let workers load LoRA adapters at run time (rollout-serve deploy --as lora). Off by "
                           "default, as in vLLM: LoRA layers cost every engine step even with no adapter loaded")
    max_lora_rank: int = Field(64, ge=1, description="largest LoRA rank a worker accepts")
    max_loras: int = Field(4, ge=1, description="LoRA adapters a worker keeps loaded at once")


class EngineSettings(BaseModel):
    # The model
    model: Path | None = Field(None, description="local Hugging Face model directory (default: the tiny model)")
    served_model_name: str | None = Field(None, description="model id clients use (default: the directory name)")
    max_model_len: int = Field(32768, description="context window served, in tokens")
    dtype: str = Field("auto", description="vLLM dtype (auto: vLLM's choice, which runs float32 checkpoints in "
                                          "bfloat16, except on a CPU without native bfloat16 (no AVX512-BF16/AMX), "
                                          "which would emulate it: there float32 stays float32; "
                                          "engine/supervisor/compute_dtype.py)")

    # Workers and their routing
    workers: int = Field(1, ge=1, description="number of aggregated vLLM workers (Dynamo dynamo.vllm processes)")
    router_mode: Literal["kv", "round-robin", "random"] = Field("kv", description="Dynamo routing policy")
    session_affinity_ttl_s: int = Field(3600, ge=1, description="how long an idle session stays bound to its worker")
    frontend_port: int = Field(8100, description="port of Dynamo's frontend (internal; the front door's way to "
                                                 "disaggregated workers, or to all with --no-embedded-router)")
    embedded_router: bool = Field(True, description="route requests to aggregated workers with Dynamo's KV router "
                                                    "inside the front door, not through Dynamo's frontend over HTTP "
                                                    "(engine/client/embedded_router.py; disaggregated workers and "
                                                    "the round-robin/random modes always go through Dynamo's "
                                                    "frontend)")
    discovery_backend: Literal["file", "etcd"] = Field("file", description="Dynamo discovery: file (one machine) or etcd")
    etcd_endpoints: str | None = Field(
        None, description="etcd's client URLs, comma-separated, for discovery_backend etcd (Dynamo's "
                          "ETCD_ENDPOINTS; default: that variable of the environment, else Dynamo's "
                          "http://localhost:2379)")
    cluster: bool = Field(
        False, description="cluster mode (docs/cluster.md): `up` starts no vLLM workers; workers on any host join "
                           "with `rollout-serve worker`, found through etcd (sets discovery_backend etcd)")
    event_broker_port: int = Field(
        20500, description="cluster mode: the port of the front door's KV-event broker that workers publish to "
                           "(from their hosts); the KV routers subscribe on the next one. One host: both are "
                           "picked at start")
    internal_host: IPvAnyAddress = Field(
        IPvAnyAddress("127.0.0.1"),
        description="the address internal planes bind and advertise (Dynamo's request plane and response streams, "
                    "the KV-event broker). Default loopback: on one machine nothing internal is reachable from "
                    "the network. Multi-host: the cluster's private interface, behind a network policy; never an "
                    "unspecified address (0.0.0.0, ::)")
    kv_events_base_port: int = Field(20080, description="ZMQ KV-event port of worker 0; worker i uses base + i")
    worker_system_base_port: int = Field(18080, description="Dynamo system (health) port of worker 0; worker i uses "
                                                            "base + i")
    block_size: int = Field(32, description="KV block size in tokens (CPU attention needs a multiple of 32)")
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache per worker, GiB (vLLM --kv-cache-memory-bytes)")
    enforce_eager: bool = Field(True, description="skip torch.compile/CUDA graphs (a faster start-up on CPU)")
    step_token_budget: int | None = Field(
        None, ge=256,
        description="per-step token budget of aggregated and decode workers (vLLM's --max-num-batched-tokens; a "
                    "longer prompt is prefilled in chunks of this size, between decode steps); default: vLLM's "
                    "for the platform (2,048 on CPU)")
    cpu_threads_per_worker: int = Field(1, ge=1, description="OpenMP threads per vLLM CPU worker")
    mocker_workers: int = Field(
        0, ge=0,
        description="simulate the engine: each of the `workers` processes runs Dynamo's mocker engine (python -m "
                    "dynamo.mocker: simulated timing, real KV events, no model weights) as this many workers, so "
                    "a fleet of workers x mocker_workers fits one machine (benchmarks/fleet_sim.py). 0: real vLLM "
                    "workers")
    mocker_speedup_ratio: float = Field(
        1.0, gt=0, description="how much faster than its modelled GPU the mocker engine runs (its --speedup-ratio)")
    startup_timeout_s: float = Field(420.0, description="how long `up` waits for every worker to become healthy")

    # Requests
    request_timeout_s: float = Field(600.0, description="longest silence of the engine on one request (504 after it)")
    stream_interval: int = Field(
        1, ge=1,
        description="tokens a worker gathers before it sends them on, for streamed responses (vLLM's "
                    "stream_interval, per request; the first token always goes at once). 1: every token as soon "
                    "as it is sampled. Larger: less work per token in every hop, tokens arrive in bursts")
    unstreamed_interval: int = Field(
        UNSTREAMED_INTERVAL, ge=1,
        description="the same, for responses the client gets in one piece (stream=false, /inference/v1/generate, "
                    "batches): the client cannot see the bursts, and each hop (worker, Dynamo, front door) handles "
                    "one message per this many tokens")

    disaggregation: DisaggregationSettings = Field(default_factory=DisaggregationSettings,
                                                   description="prefill/decode disaggregation")
    pools: PoolSettings = Field(default_factory=PoolSettings, description="capacity pools and failover")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters")
    kv_tier: KvTierSettings = Field(default_factory=KvTierSettings,
                                    description="host-DRAM KV tier on Mooncake (docs/kv_tier.md)")

    @model_validator(mode="after")
    def _consistent(self) -> EngineSettings:
        if self.internal_host.is_unspecified:
            raise ValueError(f"internal_host {self.internal_host} is every interface: name one (loopback, or the "
                             "cluster's private interface)")
        if self.disaggregation.enabled and self.disaggregation.disagg_local_max_uncached_tokens and self.router_mode != "kv":
            raise ValueError("conditional disaggregation (disagg_local_max_uncached_tokens > 0) needs router_mode kv")
        if self.mocker_workers and (self.disaggregation.enabled or self.kv_tier.enabled or self.lora.enable_lora):
            raise ValueError("mocker_workers simulates aggregated workers only: no disaggregation, KV tier or LoRA")
        if self.cluster:  # workers of other hosts find the front door, and it them, through etcd alone
            self.discovery_backend = "etcd"
        if self.pools.pools_file and self.discovery_backend != "file":
            raise ValueError("pools_file needs discovery_backend file: each deployment finds its workers through "
                             "its own discovery directory")
        return self
