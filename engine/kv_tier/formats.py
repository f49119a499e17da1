"""Bytes of one stored block (one tier object) per format, and what a tier of N bytes holds.

A block holds `block_size` tokens of every layer: per layer, vLLM's view is [heads, tokens,
content] with content = K and V of one head (2 * head_dim values). Lossless objects are those
values in the cache dtype. NVFP4 objects store each head_dim-long vector as head_dim/2 bytes of
E2M1 codes plus head_dim/16 E4M3 block scales (kernels/page_codec.py), behind a header of two FP32
global scales per layer (one per half of its content: K and V).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kernels import page_codec

ELEMENT_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
                 "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class KvShape:
    """What a model's KV cache looks like per token: layers x KV heads x head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_hf_config(cls, config: dict | Path) -> KvShape:
        if isinstance(config, Path):
            config = json.loads((config / "config.json" if config.is_dir() else config).read_text())
        config = config.get("text_config", config)
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return cls(config["num_hidden_layers"], config.get("num_key_value_heads", heads), head_dim)


def header_bytes(num_layers: int, kv_format: str) -> int:
    """NVFP4 objects start with two FP32 global scales per layer (engine/kv_tier/blocks.py)."""
    return 8 * num_layers if kv_format == "nvfp4" else 0


def object_bytes(shape: KvShape, block_size: int, kv_format: str) -> int:
    """Bytes of one block of all layers in `kv_format` ('nvfp4' or a dtype name)."""
    vectors = shape.num_layers * shape.num_kv_heads * block_size * 2  # K and V of each (layer, head, token)
    if kv_format == "nvfp4":
        return header_bytes(shape.num_layers, kv_format) + vectors * page_codec.row_bytes(shape.head_dim)
    if kv_format not in ELEMENT_BYTES:
        raise ValueError(f"unknown KV format {kv_format!r}; expected nvfp4 or one of {sorted(ELEMENT_BYTES)}")
    return vectors * shape.head_dim * ELEMENT_BYTES[kv_format]


def bytes_per_token(shape: KvShape, block_size: int, kv_format: str) -> float:
    return object_bytes(shape, block_size, kv_format) / block_size


def tier_capacity_tokens(capacity_bytes: int, shape: KvShape, block_size: int, kv_format: str) -> int:
    """Tokens a tier of `capacity_bytes` holds: whole blocks only."""
    return capacity_bytes // object_bytes(shape, block_size, kv_format) * block_size


def capacity_report(capacity_bytes: int, shape: KvShape, block_size: int) -> dict:
    """Tier capacity in tokens with NVFP4 vs BF16 blocks (for benchmarks)."""
    nvfp4 = tier_capacity_tokens(capacity_bytes, shape, block_size, "nvfp4")
    bf16 = tier_capacity_tokens(capacity_bytes, shape, block_size, "bfloat16")
    return {
        "tier_capacity_bytes": capacity_bytes,
        "tier_tokens_nvfp4": nvfp4,
        "tier_tokens_bf16": bf16,
        "tier_bytes_per_token_nvfp4": bytes_per_token(shape, block_size, "nvfp4"),
        "tier_bytes_per_token_bf16": bytes_per_token(shape, block_size, "bfloat16"),
        "tier_tokens_ratio_nvfp4_over_bf16": nvfp4 / bf16 if bf16 else float("nan"),
    }
