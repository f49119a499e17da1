"""The dtype a worker's engine computes in.

vLLM's "auto" runs a float32 checkpoint in bfloat16. A CPU without native bfloat16 arithmetic
(x86 before AVX512-BF16/AMX, such as the AVX2-only machines this project is built on) emulates it,
so it computes more slowly in bfloat16 than in float32 (docs/benchmarks.md, "Measurements behind design
choices"). So on such a CPU "auto" keeps float32 checkpoints in float32; everywhere else it is vLLM's
own choice.
"""

from __future__ import annotations

import json
from pathlib import Path

NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 AVX512-BF16 and AMX; Arm's BF16 extension


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU's flags (x86 "flags", Arm "Features" in /proc/cpuinfo) list bfloat16 arithmetic."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True  # unknown: leave the choice to vLLM
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return bool(NATIVE_BF16_FLAGS & set(value.split()))
    return True


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint's config.json declares ("float32", "bfloat16", ...)."""
    config = json.loads((model_dir / "config.json").read_text())
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return "float32" if dtype == "float" else dtype


def worker_dtype(setting: str, model_dir: Path, on_cpu: bool) -> str:
    """The --dtype a worker is started with, from the `dtype` setting."""
    if setting != "auto" or not on_cpu or cpu_has_native_bf16():
        return setting
    try:
        found = checkpoint_dtype(model_dir)
    except OSError:  # no checkpoint to read: vLLM's choice (and vLLM's error, if it is still missing at start)
        return setting
    return "float32" if found == "float32" else setting


def kv_cache_dtype(dtype: str, model_dir: Path) -> str:
    """The dtype of the KV cache of an engine started with --dtype `dtype` (and the default cache dtype)."""
    if dtype != "auto":
        return dtype
    found = checkpoint_dtype(model_dir)
    return "bfloat16" if found == "float32" else found  # vLLM's "auto"
