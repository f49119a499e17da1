"""What a deploy or weight update asks for, whichever route it came through (rollout_server/routes/deployments.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.ids import PolicyVersion


@dataclass(frozen=True)
class WeightUpdate:
    """What a request asks for, whichever endpoint it came through."""

    kind: str                # "full" | "lora"
    op: str                  # "load" | "swap" | "unload"
    path: Path | None        # None only for a LoRA unload
    name: str | None = None  # served name: a deployment's model id, a LoRA adapter's name
    pool: str | None = None
    version: PolicyVersion | None = None  # set by the RL API; otherwise the registry numbers it
