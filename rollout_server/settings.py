"""Every option of rollout-serve, in one typed place.

Each field can be set on the command line (`rollout-serve up --help` lists them)
or as an environment variable ROLLOUT_SERVE_<FIELD> (nested: ROLLOUT_SERVE_TRACES__DIR).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rollout_server.batches import BatchSettings
from rollout_server.quotas import QuotaSettings
from rollout_server.usage import UsageSettings
from trace_pipeline.config import TraceSettings


def _home_cache() -> Path:
    return Path.home() / ".cache" / "rollout-serve"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROLLOUT_SERVE_", env_nested_delimiter="__", extra="ignore")

    # The front door (our FastAPI app): what clients talk to.
    host: str = Field("127.0.0.1", description="address the front door listens on")
    port: int = Field(8000, description="port of the OpenAI-compatible front door")

    # The model.
    model: Path | None = Field(None, description="local Hugging Face model directory (default: the tiny model)")
    served_model_name: str | None = Field(None, description="model id clients use (default: the directory name)")
    max_model_len: int = Field(32768, description="context window served, in tokens")
    dtype: str = Field("auto", description="vLLM dtype (auto: the checkpoint's; the tiny model is float32, fastest on AVX2)")

    # The Dynamo stack.
    workers: int = Field(1, ge=1, description="number of aggregated vLLM workers (Dynamo dynamo.vllm processes)")
    router_mode: Literal["kv", "round-robin", "random"] = Field("kv", description="Dynamo frontend routing policy")
    session_affinity_ttl_s: int = Field(3600, ge=1, description="how long Dynamo keeps an idle session bound to its worker")
    frontend_port: int = Field(8100, description="port of Dynamo's frontend (internal; the front door proxies to it)")
    discovery_backend: Literal["file", "etcd"] = Field("file", description="Dynamo discovery: file (one machine) or etcd")
    kv_events_base_port: int = Field(20080, description="ZMQ KV-event port of worker 0; worker i uses base + i")
    worker_system_base_port: int = Field(18080, description="Dynamo system (health) port of worker 0; worker i uses base + i")
    block_size: int = Field(32, description="KV block size in tokens (CPU attention needs a multiple of 32)")
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache per worker, GiB (vLLM --kv-cache-memory-bytes)")
    enforce_eager: bool = Field(True, description="skip torch.compile/CUDA graphs (2x faster start-up on CPU)")
    cpu_threads_per_worker: int = Field(1, ge=1, description="OpenMP threads per vLLM CPU worker")
    startup_timeout_s: float = Field(420.0, description="how long `up` waits for every worker to become healthy")

    # State.
    cache_dir: Path = Field(default_factory=_home_cache, description="models and compiled artefacts")
    state_dir: Path | None = Field(None, description="run-time state: logs, discovery files, database (default: cache_dir/state)")
    database_url: str | None = Field(None, description="SQLAlchemy URL for keys/usage (default: SQLite in state_dir)")
    admin_key: str | None = Field(None, description="API key with admin rights (deployments, weight updates)")

    # Requests.
    request_timeout_s: float = Field(600.0, description="upper bound on one request through the stack")
    default_max_tokens: int | None = Field(None, description="max_tokens when a chat request sets none (None: fill the context, as vLLM)")
    policy_version: int = Field(0, description="policy (weight) version of the base model")

    # Trace capture (nested: set with ROLLOUT_SERVE_TRACES__<FIELD>, e.g. ROLLOUT_SERVE_TRACES__ENABLED=false).
    traces: TraceSettings = Field(default_factory=TraceSettings,
                                  description="trace capture and store (relative dir: under state_dir)")

    usage: UsageSettings = Field(default_factory=UsageSettings, description="usage accounting (ROLLOUT_SERVE_USAGE__*)")
    quotas: QuotaSettings = Field(default_factory=QuotaSettings,
                                  description="default per-key rate limits (ROLLOUT_SERVE_QUOTAS__*)")
    batches: BatchSettings = Field(default_factory=BatchSettings, description="Batch API (ROLLOUT_SERVE_BATCHES__*)")

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
