"""What a worker's KV tier connector is told: vLLM's --kv-transfer-config for it.

Built by the stack (engine/supervisor/stack.py), read by the connector (engine/kv_tier/connector.py). The
dict is a plain vLLM connector config, so it also fits as one entry of vLLM's MultiConnector
`connectors` list (e.g. next to NixlConnector for disaggregated workers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

CONNECTOR_CLASS = "KvTierConnector"
CONNECTOR_MODULE = "engine.kv_tier.connector"


@dataclass(frozen=True)
class TierConnectorConfig:
    master: str  # mooncake_master RPC address, host:port
    model_id: str  # the served model name: part of every key
    nvfp4: bool = True
    policy_version: int = 0  # used while policy_version_file does not exist
    policy_version_file: str | None = None  # the live-update hook (engine/kv_tier/policy.py)
    announce: bool = True  # tell the router what the tier holds (engine/kv_tier/events.py)

    @classmethod
    def from_extra(cls, extra: dict) -> TierConnectorConfig:
        missing = [name for name in ("master", "model_id") if not extra.get(name)]
        if missing:
            raise ValueError(f"{CONNECTOR_CLASS} needs kv_connector_extra_config fields {missing}")
        return cls(str(extra["master"]), str(extra["model_id"]), bool(extra.get("nvfp4", True)),
                   int(extra.get("policy_version", 0)), extra.get("policy_version_file"),
                   bool(extra.get("announce", True)))

    @property
    def version_path(self) -> Path | None:
        return Path(self.policy_version_file) if self.policy_version_file else None


def kv_transfer_config(config: TierConnectorConfig) -> dict:
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": asdict(config),
    }
