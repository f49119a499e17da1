"""Two real tiny Qwen2 checkpoints: the base (variant 0) and a fine-tune (variant 1). Untrained ones
(tests/tiny_models.py) for the checks of the fast tier; for a module marked `stack`, the trained ones the stack
serves."""

import pytest

from tests.tiny_models import trained_tiny_model, untrained_tiny_model


def _tiny_model(request, variant: int):
    served = request.node.get_closest_marker("stack") is not None
    return trained_tiny_model(variant) if served else untrained_tiny_model(variant)


@pytest.fixture(scope="module")
def base_dir(request):
    return _tiny_model(request, 0)


@pytest.fixture(scope="module")
def finetuned_dir(request):
    """Same architecture and tokenizer as the base, other weights. Tests copy it before changing anything."""
    return _tiny_model(request, 1)
