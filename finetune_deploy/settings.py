"""Settings of checkpoint deploys; the settings tree (rollout_server/settings.py) nests them as `deploy`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from engine.ids import DEFAULT_POOL
from finetune_deploy.rollout_plan import Mode


class DeploySettings(BaseModel):
    pool: str = Field(DEFAULT_POOL, description="name of the pool the stack's workers form, in the deploy registry")
    in_flight: Literal["finish", "abort"] = Field(
        "finish", description="requests running on a worker that is about to load new weights: finish them on the "
                              "old weights first, or abort them with a retryable error")
    mode: Mode = Field("rolling", description="full-weight deploys: rolling (one worker at a time; needs 2+ "
                                              "workers, else all_at_once) or all_at_once")
