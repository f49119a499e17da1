"""Settings of checkpoint deploys; the settings tree (rollout_server/settings.py) nests them as `deploy`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

from engine.ids import DEFAULT_POOL
from engine.weight_stamps import RunningKv
from finetune_deploy.rollout_plan import Mode

InFlight = Literal["finish", "abort", "keep"]


class DeploySettings(BaseModel):
    pool: str = Field(DEFAULT_POOL, description="name of the pool the stack's workers form, in the deploy registry")
    in_flight: InFlight = Field(
        "finish", description="requests running on a worker that is about to load new weights: finish them on the "
                              "old weights first, abort them with a retryable error, or keep them (frozen while the "
                              "weights change, then they go on under the new ones; the RL routes' default)")
    running_kv: RunningKv = Field(
        "keep", description="in_flight keep: the KV that kept requests computed under the old weights is kept "
                            "(no recompute; later tokens attend to it), or recomputed under the new weights (one "
                            "prefill per running request)")
    mode: Mode = Field("rolling", description="full-weight deploys: rolling (one worker at a time; needs 2+ "
                                              "workers, else all_at_once) or all_at_once")
    checkpoint_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="directories (symlinks resolved) that checkpoints and LoRA adapters may be deployed from, "
                    "besides the cache dir (models) and the state dir (pushed weights), which always are; on the "
                    "command line and in the environment separated by ':' as in PATH. Empty by default: an admin "
                    "key must not be able to load any file the server can read")

    @field_validator("checkpoint_roots", mode="before")
    @classmethod
    def _split_path_list(cls, value):
        """A flag or environment variable gives one string, `/a:/b`, as PATH does (NoDecode: not read as JSON)."""
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part]
        return value
