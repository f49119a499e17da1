"""The tiny model as the tests use it.

- `untrained_tiny_model`: its tokenizer, chat template, config and weights straight from the seed, built in
  seconds: everything the fast tier needs (tokenizing, app state, checkpoint checks), with no training run.
- `trained_tiny_model`: what the stack serves (about two minutes of training per variant, cached). Only tests
  of the `stack` tier may ask for it; the fast tier builds no trained model.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from rollout_server.harness.stack import CACHE_DIR, TEST_TIER_ENV
from rollout_server.tiny_model.builder import ensure_tiny_model
from rollout_server.tiny_model.training import TrainingRecipe

UNTRAINED = TrainingRecipe(steps=0, warmup_steps=0)


@functools.cache
def untrained_tiny_model(variant: int = 0, tool_format: str = "hermes") -> Path:
    return ensure_tiny_model(variant, CACHE_DIR / "untrained-models", tool_format, UNTRAINED)


def trained_tiny_model(variant: int = 0, tool_format: str = "hermes") -> Path:
    if os.environ.get(TEST_TIER_ENV) == "fast":
        raise RuntimeError("a test without the `stack` marker asked for the trained tiny model: mark it `stack`")
    return ensure_tiny_model(variant, CACHE_DIR / "models", tool_format)
