"""Bytes of one stored block (one tier object) per format, and what a tier of N bytes holds.

A block holds `block_size` tokens of every layer: per layer, vLLM's view is [heads, tokens,
content] with content = K and V of one head (2 * head_dim values). Lossless objects are those
values in the cache dtype. NVFP4 objects store each head_dim-long vector as head_dim/2 bytes of
E2M1 codes plus head_dim/16 E4M3 block scales (kernels/page_codec.py); the two FP32 global scales per layer
(one per half of its content: K and V) ride in the block scales' sign bits (engine/kv_tier/blocks.py).

The tier stores each object in a slot of `slot_bytes(object_bytes)`: the smallest size mooncake_master's
allocator can hand back to an object once another one is evicted (see `slot_bytes`). Capacity in tokens
counts slots.
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


def object_bytes(shape: KvShape, block_size: int, kv_format: str) -> int:
    """Bytes of one block of all layers in `kv_format` ('nvfp4' or a dtype name)."""
    vectors = shape.num_layers * shape.num_kv_heads * block_size * 2  # K and V of each (layer, head, token)
    if kv_format == "nvfp4":
        return vectors * page_codec.row_bytes(shape.head_dim)
    if kv_format not in ELEMENT_BYTES:
        raise ValueError(f"unknown KV format {kv_format!r}; expected nvfp4 or one of {sorted(ELEMENT_BYTES)}")
    return vectors * shape.head_dim * ELEMENT_BYTES[kv_format]


def slot_bytes(size: int) -> int:
    """The bytes the tier takes for an object of `size` bytes: the smallest allocator bin >= size.

    mooncake_master's offset allocator (sebbbi's OffsetAllocator) files a freed range under the largest bin
    <= its size, and serves a request of `size` bytes from bins >= `size` rounded up to a bin. Bins have 3
    mantissa bits: a bin is a number whose binary digits after the leading four are zeros. So the room an
    evicted object leaves can be reused by an object of the same size only if that size is a bin; otherwise it
    waits for a neighbour to be evicted too, and a full tier refuses most puts (measured on a 16 MiB tier full
    of 18,464-byte NVFP4 blocks: 40 of every 93 blocks saved were stored; of 18,432-byte objects, all 93). The
    store therefore puts each object in a slot of a bin's size: at most 12.5% more bytes, none for sizes that
    are bins already (power-of-two lossless blocks)."""
    if size < 16:
        return size
    shift = size.bit_length() - 4  # keep the leading four binary digits, round the rest up
    return -(-size >> shift) << shift


def bytes_per_token(shape: KvShape, block_size: int, kv_format: str) -> float:
    return object_bytes(shape, block_size, kv_format) / block_size


def tier_capacity_tokens(capacity_bytes: int, shape: KvShape, block_size: int, kv_format: str) -> int:
    """Tokens a tier of `capacity_bytes` holds: whole blocks only, each in its slot."""
    return capacity_bytes // slot_bytes(object_bytes(shape, block_size, kv_format)) * block_size


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
