"""Settings of the host-DRAM KV tier; engine/settings.py nests them as `kv_tier`."""

from __future__ import annotations

import pydantic


class KvTierSettings(pydantic.BaseModel):
    enabled: bool = pydantic.Field(False, description="run the Mooncake KV tier and give workers its connector")
    capacity_gib: float = pydantic.Field(4.0, gt=0, description="host DRAM held by the tier (Mooncake segment), GiB")
    nvfp4: bool = pydantic.Field(True, description="store blocks NVFP4-compressed; false: the cache dtype as is (lossless)")
    router_host_weight: float = pydantic.Field(
        0.5, ge=0.0, le=1.0,
        description="Dynamo router credit for a prefix held in the tier, relative to one on the worker's own cache "
                    "(--router-host-cache-hit-weight); 0: the router ignores the tier")
    port_base: int = pydantic.Field(
        20580, ge=1, le=65533,
        description="mooncake_master RPC port; base + 1: its metrics/health port; base + 2: the segment holder's port")

    def as_env(self) -> dict[str, str]:
        """These settings as the environment of a `rollout-serve up` child (benchmarks toggle the tier so)."""
        return {f"ROLLOUT_SERVE_KV_TIER__{name.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
                for name, value in self.model_dump().items()}

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * 2**30)

    @property
    def master_port(self) -> int:
        return self.port_base

    @property
    def metrics_port(self) -> int:
        return self.port_base + 1

    @property
    def holder_port(self) -> int:
        return self.port_base + 2

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.master_port}"
