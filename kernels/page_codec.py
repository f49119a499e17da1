"""GQA/MHA page codec: vLLM's paged KV cache with each (token, head) vector stored in NVFP4.

vLLM hands a KV connector one tensor per layer, [num_blocks, 2, block_size, num_kv_heads, head_dim]
(index 0 of dim 1 is K, 1 is V). The NVFP4 page keeps that shape but replaces each head vector by
a byte row of head_dim/2 + head_dim/16 bytes:

    bytes [0, D/2)          NVFP4 codes, two per byte (element 2i in the low nibble)
    bytes [D/2, D/2 + D/16) E4M3 block scales, one per 16 dims

One FP32 global scale per layer for K and one for V (PageScales), set by calibration.
"""

from dataclasses import dataclass

import torch

from kernels import nvfp4

BYTES_PER_ELEMENT = {"bf16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class PageScales:
    k_global_scale: float
    v_global_scale: float

    @classmethod
    def calibrate(cls, k: torch.Tensor, v: torch.Tensor) -> "PageScales":
        return cls(nvfp4.global_scale_for(k), nvfp4.global_scale_for(v))


def row_bytes(head_dim: int) -> int:
    """Bytes of one head vector in NVFP4: packed codes then block scales."""
    if head_dim % nvfp4.BLOCK_SIZE:
        raise ValueError(f"NVFP4 pages need head_dim to be a multiple of {nvfp4.BLOCK_SIZE}, got {head_dim}")
    return head_dim // 2 + head_dim // nvfp4.BLOCK_SIZE


def bytes_per_token(num_kv_heads: int, head_dim: int, kv_format: str) -> int:
    """Bytes of one token's K and V in one layer for 'bf16', 'fp8' or 'nvfp4'."""
    if kv_format == "nvfp4":
        return 2 * num_kv_heads * row_bytes(head_dim)
    if kv_format not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown KV format {kv_format!r}; expected bf16, fp8 or nvfp4")
    return int(2 * num_kv_heads * head_dim * BYTES_PER_ELEMENT[kv_format])


def encode_heads(x: torch.Tensor, global_scale: float) -> torch.Tensor:
    """[..., head_dim] -> uint8 [..., row_bytes(head_dim)]."""
    q = nvfp4.quantize(x, global_scale)
    return torch.cat((q.packed, q.block_scales), dim=-1)


def decode_heads(rows: torch.Tensor, global_scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [..., row_bytes] -> [..., head_dim] of `dtype`."""
    head_dim = _head_dim_of(rows)
    packed, block_scales = rows[..., : head_dim // 2], rows[..., head_dim // 2 :]
    return nvfp4.dequantize(nvfp4.Nvfp4Tensor(packed, block_scales, global_scale), dtype)


def encode_kv_cache(cache: torch.Tensor, scales: PageScales) -> torch.Tensor:
    """[num_blocks, 2, block_size, heads, head_dim] -> uint8 [num_blocks, 2, block_size, heads, row_bytes]."""
    _check_cache_shape(cache)
    k = encode_heads(cache[:, 0], scales.k_global_scale)
    v = encode_heads(cache[:, 1], scales.v_global_scale)
    return torch.stack((k, v), dim=1)


def decode_kv_cache(pages: torch.Tensor, scales: PageScales, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of encode_kv_cache (up to quantization)."""
    _check_cache_shape(pages)
    k = decode_heads(pages[:, 0], scales.k_global_scale, dtype)
    v = decode_heads(pages[:, 1], scales.v_global_scale, dtype)
    return torch.stack((k, v), dim=1)


def _head_dim_of(rows: torch.Tensor) -> int:
    # row = D/2 + D/16 = 9 * (D/16), so a valid row length is a multiple of 9.
    if rows.dtype != torch.uint8 or rows.ndim == 0 or rows.shape[-1] % 9:
        raise ValueError(f"NVFP4 page rows must be uint8 with 9 * head_dim / 16 bytes, got {rows.dtype} {tuple(rows.shape)}")
    return rows.shape[-1] * 16 // 9


def _check_cache_shape(cache: torch.Tensor) -> None:
    if cache.ndim != 5 or cache.shape[1] != 2:
        raise ValueError(f"expected a paged KV cache [num_blocks, 2, block_size, heads, dim], got {tuple(cache.shape)}")
