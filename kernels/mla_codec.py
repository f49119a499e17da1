"""MLA row codec: one token's compressed KV for one layer (DeepSeek-V3 / GLM class) in 352 bytes.

An MLA cache row holds a 512-dim latent (shared by K and V) and 64 RoPE dims (K only).
FP8 stores it in 576 bytes; this codec stores it in 352:

    bytes [0, 256)    latent, NVFP4 codes, two per byte (element 2i in the low nibble)
    bytes [256, 288)  latent block scales, 32 x E4M3 (one per 16 latent dims)
    bytes [288, 352)  RoPE dims, 64 x E4M3

The two FP32 scales (NVFP4 global scale of the latent, FP8 scale of the RoPE part) are per
layer, not per row: a cache is written token by token, so they come from calibration.
"""

from dataclasses import dataclass

import torch

from kernels import fp8, nvfp4

LATENT_DIM = 512
ROPE_DIM = 64
LATENT_PACKED_BYTES = LATENT_DIM // 2
LATENT_SCALES_OFFSET = LATENT_PACKED_BYTES
ROPE_OFFSET = LATENT_SCALES_OFFSET + LATENT_DIM // nvfp4.BLOCK_SIZE
ROW_BYTES = ROPE_OFFSET + ROPE_DIM
FP8_ROW_BYTES = LATENT_DIM + ROPE_DIM
BF16_ROW_BYTES = 2 * FP8_ROW_BYTES


@dataclass(frozen=True)
class MlaScales:
    latent_global_scale: float  # NVFP4 global scale: 448 * 6 / amax(latent)
    rope_scale: float  # FP8 scale: amax(rope) / 448

    @classmethod
    def calibrate(cls, latent: torch.Tensor, rope: torch.Tensor) -> "MlaScales":
        return cls(nvfp4.global_scale_for(latent), fp8.fp8_scale_for(rope))


def bytes_per_token(kv_format: str) -> int:
    """Bytes of one token's MLA row in one layer for 'bf16', 'fp8' or 'nvfp4'."""
    sizes = {"bf16": BF16_ROW_BYTES, "fp8": FP8_ROW_BYTES, "nvfp4": ROW_BYTES}
    if kv_format not in sizes:
        raise ValueError(f"unknown KV format {kv_format!r}; expected one of {sorted(sizes)}")
    return sizes[kv_format]


def encode_rows(latent: torch.Tensor, rope: torch.Tensor, scales: MlaScales) -> torch.Tensor:
    """latent [..., 512] and rope [..., 64] -> uint8 rows [..., 352]."""
    if latent.shape[-1] != LATENT_DIM or rope.shape[-1] != ROPE_DIM or latent.shape[:-1] != rope.shape[:-1]:
        raise ValueError(
            f"MLA rows need latent [..., {LATENT_DIM}] and rope [..., {ROPE_DIM}] with the same leading "
            f"shape, got {tuple(latent.shape)} and {tuple(rope.shape)}"
        )
    nvfp4.check_quantizable(rope)
    q = nvfp4.quantize(latent, scales.latent_global_scale)
    rope_bytes = fp8.fp8_quantize(rope, scales.rope_scale)
    return torch.cat((q.packed, q.block_scales, rope_bytes), dim=-1)


def decode_rows(rows: torch.Tensor, scales: MlaScales, dtype: torch.dtype = torch.float32):
    """uint8 rows [..., 352] -> (latent [..., 512], rope [..., 64]) of `dtype`."""
    if rows.dtype != torch.uint8 or rows.shape[-1] != ROW_BYTES:
        raise ValueError(f"MLA rows must be uint8 [..., {ROW_BYTES}], got {rows.dtype} {tuple(rows.shape)}")
    packed = rows[..., :LATENT_SCALES_OFFSET]
    block_scales = rows[..., LATENT_SCALES_OFFSET:ROPE_OFFSET]
    latent = nvfp4.dequantize(nvfp4.Nvfp4Tensor(packed, block_scales, scales.latent_global_scale), dtype)
    rope = fp8.fp8_dequantize(rows[..., ROPE_OFFSET:], scales.rope_scale).to(dtype)
    return latent, rope
