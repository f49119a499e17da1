"""Two real tiny Qwen2 checkpoints, built once per session: the base (variant 0) and a fine-tune (variant 1)."""

import pytest

from rollout_server.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def base_dir(model_cache):
    return ensure_tiny_model(0, model_cache)


@pytest.fixture(scope="session")
def finetuned_dir(model_cache):
    """Same architecture and tokenizer as the base, other weights. Tests copy it before changing anything."""
    return ensure_tiny_model(1, model_cache)
