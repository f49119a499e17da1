"""NVFP4 blocks from the tier are as accurate as the kernels' NVFP4 KV, on the tiny model's real activations.

The kernels issue measured NVFP4 KV by the attention output of the last 128 positions of a text
against BF16 KV (benchmarks/kv_formats.py: `attn_rel_error_nvfp4`, per-layer calibrated scales).
Here the same activations go through the tier instead: BF16 caches (what the workers hold) ->
NVFP4 objects -> caches, and the same attention rows are compared against BF16 KV.
"""

import math

import pytest
import torch

from benchmarks.kv_formats import accuracy_report, attention_rows, capture_activations
from engine.kv_tier.blocks import BlockCodec, kernel_view
from rollout_server.settings import Settings
from rollout_server.tiny_model import resolve_model
from tests.stack_harness import CACHE_DIR

BS = 32
MARGIN = 1.05  # the tier's error may exceed the kernels' figure by at most 5%


@pytest.fixture(scope="module")
def activations():
    model_dir, _ = resolve_model(Settings(cache_dir=CACHE_DIR))  # the tiny model, or ROLLOUT_SERVE_MODEL
    return capture_activations(model_dir)


def through_the_tier(k: torch.Tensor, v: torch.Tensor, nvfp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [seq, heads, head_dim] -> BF16 cache blocks -> tier objects -> back; the partial last block stays."""
    seq, heads, head_dim = k.shape
    full = seq // BS * BS
    content = torch.cat((k[:full], v[:full]), dim=-1).bfloat16()  # [tokens, heads, K|V]
    cache = content.view(full // BS, BS, heads, 2 * head_dim).permute(0, 2, 1, 3).contiguous()
    codec = BlockCodec.for_caches([cache], nvfp4)
    ids = list(range(cache.shape[0]))
    out = torch.zeros_like(cache)
    codec.write_blocks(codec.read_blocks([kernel_view(cache)], ids), [kernel_view(out)], ids)
    back = out.permute(0, 2, 1, 3).reshape(full, heads, 2 * head_dim).float()
    k2, v2 = k.bfloat16().float(), v.bfloat16().float()
    k2[:full], v2[:full] = back[..., :head_dim], back[..., head_dim:]
    return k2, v2


def relative_error_vs_bf16(activations, nvfp4: bool) -> float:
    err = norm = 0.0
    for layer in activations:
        sm_scale = 1 / math.sqrt(layer.q.shape[-1])
        base, _ = attention_rows(layer.q, layer.k.bfloat16().float(), layer.v.bfloat16().float(), sm_scale)
        out, _ = attention_rows(layer.q, *through_the_tier(layer.k, layer.v, nvfp4), sm_scale)
        err += (out - base).pow(2).sum().item()
        norm += base.pow(2).sum().item()
    return math.sqrt(err / norm)


def test_nvfp4_tier_blocks_are_within_the_kernels_nvfp4_accuracy(activations):
    kernels = accuracy_report(activations)["attn_rel_error_nvfp4"]
    tier = relative_error_vs_bf16(activations, nvfp4=True)
    print(f"attention-output relative error vs BF16 KV: tier NVFP4 {tier:.4f}, kernels' NVFP4 {kernels:.4f}")
    assert 0 < tier <= kernels * MARGIN


def test_lossless_tier_blocks_change_nothing(activations):
    assert relative_error_vs_bf16(activations, nvfp4=False) == 0.0
