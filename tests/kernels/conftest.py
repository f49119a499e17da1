"""Kernel tests run on CPU under Triton's interpreter, or compiled on a CUDA GPU when there is one.

TRITON_INTERPRET is set by tests/conftest.py, before anything imports Triton. Tests marked `gpu`
are skipped when CUDA is absent (and only then).
"""

from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords and HERE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where Triton kernels run: the GPU if present, else the CPU through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
