"""Two real tiny Qwen2 checkpoints, shared with the stack tests through the model cache: the base (variant 0)
and a fine-tune (variant 1)."""

import pytest

from rollout_server.tiny_model import ensure_tiny_model
from tests.stack_harness import CACHE_DIR


@pytest.fixture(scope="session")
def base_dir():
    return ensure_tiny_model(0, CACHE_DIR / "models")


@pytest.fixture(scope="session")
def finetuned_dir():
    """Same architecture and tokenizer as the base, other weights. Tests copy it before changing anything."""
    return ensure_tiny_model(1, CACHE_DIR / "models")
