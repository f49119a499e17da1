"""Every option of rollout-serve, in one typed place.

Each field can be set on the command line (`rollout-serve up --help` lists them)
or as an environment variable ROLLOUT_SERVE_<FIELD> (nested: ROLLOUT_SERVE_TRACES__DIR).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.kv_tier.settings import KvTierSettings
from finetune_deploy.settings import DeploySettings
from trace_pipeline.config import TraceSettings

# Defaults measured by benchmarks/agentic.py (docs/benchmarks.md, "Agentic sessions").
DISAGG_LOCAL_MAX_UNCACHED_TOKENS = 512
DISAGG_LOCAL_MIN_CACHED_FRACTION = 0.5
PREFILL_BUDGET_TOKENS = 8192
# Tokens per engine message for whole responses (CPU per token with 16 vs 1: docs/benchmarks.md, "Front door").
UNSTREAMED_INTERVAL = 16


def _home_cache() -> Path:
    return Path.home() / ".cache" / "rollout-serve"


class UsageSettings(BaseModel):
    enabled: bool = Field(True, description="count every request's tokens per key, team and model (rollout_server/usage.py)")
    flush_every_s: float = Field(1.0, gt=0, description="how often the aggregated counts are written (the most a "
                                                        "killed process loses)")


class QuotaSettings(BaseModel):
    """Defaults for keys with no row (or a NULL column) in key_limits (rollout_server/quotas.py)."""

    requests_per_min: int | None = Field(None, ge=1, description="requests per minute per key (None: no limit)")
    tokens_per_min: int | None = Field(None, ge=1, description="prompt + completion tokens per minute per key "
                                                               "(None: no limit)")
    limits_cache_s: float = Field(10.0, ge=0, description="how long a key's limits are cached before key_limits "
                                                          "is read again")


class BatchSettings(BaseModel):
    enabled: bool = Field(True, description="serve the Batch API (rollout_server/batches.py)")
    dir: Path = Field(Path("batches"), description="batch files (relative: under the state dir)")
    database_url: str | None = Field(None, description="batch records (default: SQLite <dir>/batches.db)")
    max_in_flight: int = Field(4, ge=1, description="batch lines running at once")
    max_file_bytes: int = Field(200 * 2**20, ge=1, description="largest input file accepted")
    max_lines: int = Field(50_000, ge=1, description="most lines in one input file")
    poll_s: float = Field(1.0, gt=0, description="the runner's idle re-check interval")
    yield_sleep_s: float = Field(0.5, gt=0, description="pause while interactive load asks batches to yield")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROLLOUT_SERVE_", env_nested_delimiter="__", extra="ignore")

    # The front door (our FastAPI app): what clients talk to.
    host: str = Field("127.0.0.1", description="address the front door listens on")
    port: int = Field(8000, description="port of the OpenAI-compatible front door")

    # The model.
    model: Path | None = Field(None, description="local Hugging Face model directory (default: the tiny model)")
    served_model_name: str | None = Field(None, description="model id clients use (default: the directory name)")
    max_model_len: int = Field(32768, description="context window served, in tokens")
    dtype: str = Field("auto", description="vLLM dtype (auto: vLLM's choice, which runs float32 checkpoints in "
                                          "bfloat16, except on a CPU without native bfloat16 (no AVX512-BF16/AMX), "
                                          "which would emulate it: there float32 stays float32; engine/compute_dtype.py)")

    # The Dynamo stack.
    workers: int = Field(1, ge=1, description="number of aggregated vLLM workers (Dynamo dynamo.vllm processes)")
    router_mode: Literal["kv", "round-robin", "random"] = Field("kv", description="Dynamo frontend routing policy")
    session_affinity_ttl_s: int = Field(3600, ge=1, description="how long an idle session stays bound to its worker")
    frontend_port: int = Field(8100, description="port of Dynamo's frontend (internal; the front door's way to "
                                                 "disaggregated workers, or to all with --no-embedded-router)")
    embedded_router: bool = Field(True, description="route requests to aggregated workers with Dynamo's KV router "
                                                    "inside the front door, not through Dynamo's frontend over HTTP "
                                                    "(engine/embedded_router.py; disaggregated workers and the "
                                                    "round-robin/random modes always go through Dynamo's frontend)")
    discovery_backend: Literal["file", "etcd"] = Field("file", description="Dynamo discovery: file (one machine) or etcd")
    kv_events_base_port: int = Field(20080, description="ZMQ KV-event port of worker 0; worker i uses base + i")
    worker_system_base_port: int = Field(18080, description="Dynamo system (health) port of worker 0; worker i uses base + i")
    block_size: int = Field(32, description="KV block size in tokens (CPU attention needs a multiple of 32)")
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache per worker, GiB (vLLM --kv-cache-memory-bytes)")
    enforce_eager: bool = Field(True, description="skip torch.compile/CUDA graphs (2x faster start-up on CPU)")
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
    cpu_threads_per_worker: int = Field(1, ge=1, description="OpenMP threads per vLLM CPU worker")
    startup_timeout_s: float = Field(420.0, description="how long `up` waits for every worker to become healthy")

    # Prefill/decode disaggregation (engine/disaggregation.py): both counts > 0 replace `workers`.
    prefill_workers: int = Field(0, ge=0, description="prefill-only vLLM workers; with decode_workers, serve "
                                                      "disaggregated (KV moves over NIXL); 0: aggregated workers")
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
    step_token_budget: int | None = Field(
        None, ge=256,
        description="per-step token budget of aggregated and decode workers (vLLM's --max-num-batched-tokens; a "
                    "longer prompt is prefilled in chunks of this size, between decode steps); default: vLLM's "
                    "for the platform (2,048 on CPU)")
    prefill_budget_tokens: int = Field(PREFILL_BUDGET_TOKENS, ge=256,
                                       description="per-step prefill token budget of prefill workers (longer prompts "
                                                   "are prefilled in chunks of this size)")
    nixl_progress_thread: bool = Field(
        False, description="CPU workers: keep NIXL's UCX progress thread (it busy-polls the worker's core; "
                           "without it UCX progresses whenever vLLM checks a transfer). GPU workers always keep it")
    disagg_kv_lease_s: int = Field(
        300, ge=10,
        description="how long a prefill worker keeps a request's KV for its decode worker to read (vLLM's "
                    "kv_lease_duration; its 30 s default expires on a loaded CPU machine and the decode worker "
                    "then reads freed blocks)")
    # Capacity pools (engine/pools.py, docs/pools.md) and failover.
    pools_file: Path | None = Field(None, description="TOML file declaring serverless and reserved pools (see "
                                                      "docs/pools.md); the stack's own workers are the default pool")
    pool_base_port: int = Field(21000, lt=32768 - 40, description="first port of the pools' deployments (40 ports "
                                                                  "each; Dynamo's system ports must be below 32768)")
    pool_check_interval_s: float = Field(1.0, gt=0, description="how often every deployment's health is checked "
                                                                "(unhealthy: out of rotation)")
    restart_dead_workers: bool = Field(True, description="start again a worker or frontend process that died "
                                                         "(not for disaggregated workers)")
    enable_lora: bool = Field(
        False, description="let workers load LoRA adapters at run time (rollout-serve deploy --as lora). Off by "
                           "default, as in vLLM: LoRA layers cost every engine step even with no adapter loaded")
    max_lora_rank: int = Field(64, ge=1, description="largest LoRA rank a worker accepts")
    max_loras: int = Field(4, ge=1, description="LoRA adapters a worker keeps loaded at once")

    # State.
    cache_dir: Path = Field(default_factory=_home_cache, description="models and compiled artefacts")
    state_dir: Path | None = Field(None, description="run-time state: logs, discovery files, database (default: cache_dir/state)")
    database_url: str | None = Field(None, description="SQLAlchemy URL for keys/usage (default: SQLite in state_dir)")
    admin_key: str | None = Field(None, description="API key with admin rights (deployments, weight updates)")
    keys_recheck_s: float = Field(2.0, ge=0, description="how long the server trusts what it last read of a key "
                                                      "(or of whether any key exists): keys created or revoked with "
                                                      "`rollout-serve keys` take effect within this delay")

    # Requests.
    request_timeout_s: float = Field(600.0, description="upper bound on one request through the stack")
    max_request_body_mib: float = Field(32.0, gt=0, description="largest JSON request body accepted (413 above it); a "
                                        "1M-token prompt is ~4 MiB as text, ~7 MiB as token ids")
    default_max_tokens: int | None = Field(None, description="max_tokens when a chat request sets none (None: fill the context, as vLLM)")
    session_prompt_tokens: int = Field(
        4_000_000, ge=0,
        description="token ids of named sessions' chat prompts the front door keeps (with their text: ~8 bytes a "
                    "token for ASCII text, up to ~20 otherwise), so that a returning turn tokenizes only what it adds; 0: every prompt is tokenized whole")

    # Trace capture (nested: set with ROLLOUT_SERVE_TRACES__<FIELD>, e.g. ROLLOUT_SERVE_TRACES__ENABLED=false).
    traces: TraceSettings = Field(default_factory=TraceSettings,
                                  description="trace capture and store (relative dir: under state_dir)")

    usage: UsageSettings = Field(default_factory=UsageSettings, description="usage accounting (ROLLOUT_SERVE_USAGE__*)")
    quotas: QuotaSettings = Field(default_factory=QuotaSettings,
                                  description="default per-key rate limits (ROLLOUT_SERVE_QUOTAS__*)")
    batches: BatchSettings = Field(default_factory=BatchSettings, description="Batch API (ROLLOUT_SERVE_BATCHES__*)")
    kv_tier: KvTierSettings = Field(default_factory=KvTierSettings,
                                    description="host-DRAM KV tier on Mooncake (ROLLOUT_SERVE_KV_TIER__*, docs/kv_tier.md)")
    deploy: DeploySettings = Field(default_factory=DeploySettings,
                                   description="checkpoint deploys and RL weight sync (ROLLOUT_SERVE_DEPLOY__*)")

    @model_validator(mode="after")
    def _disaggregation_needs_both_pools(self) -> Settings:
        if (self.prefill_workers > 0) != (self.decode_workers > 0):
            raise ValueError("prefill_workers and decode_workers go together: set both (disaggregated) or neither")
        if self.prefill_workers and self.disagg_local_max_uncached_tokens and self.router_mode != "kv":
            raise ValueError("conditional disaggregation (disagg_local_max_uncached_tokens > 0) needs router_mode kv")
        if self.pools_file and self.discovery_backend != "file":
            raise ValueError("pools_file needs discovery_backend file: each deployment finds its workers through "
                             "its own discovery directory")
        return self

    @property
    def resolved_batch_dir(self) -> Path:
        return self.batches.dir if self.batches.dir.is_absolute() else self.resolved_state_dir / self.batches.dir

    @property
    def resolved_batch_database_url(self) -> str:
        return self.batches.database_url or f"sqlite:///{self.resolved_batch_dir / 'batches.db'}"

    @property
    def resolved_trace_dir(self) -> Path:
        return self.traces.dir if self.traces.dir.is_absolute() else self.resolved_state_dir / self.traces.dir

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir or self.cache_dir / "state"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_state_dir / 'rollout-serve.db'}"
