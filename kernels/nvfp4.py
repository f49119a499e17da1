"""NVFP4 reference codec in plain PyTorch: the ground truth the Triton kernels are tested against.

NVFP4 stores a tensor as 4-bit E2M1 values in blocks of 16 consecutive elements along the
last dimension; each block carries one FP8 E4M3 scale, and the tensor one FP32 scale.
The scale rules follow NVIDIA's recipe:

    global_scale = 448 * 6 / amax(|tensor|)                       (FP32)
    block_scale  = e4m3(amax(|block|) / 6 * global_scale)          (FP8 E4M3, saturating)
    code         = e2m1(x / (block_scale / global_scale))          (round to nearest even, saturating)
    x'           = e2m1_value(code) * (block_scale / global_scale)

Byte order and layouts are documented in docs/kernels.md.
"""

from dataclasses import dataclass

import torch

from kernels.fp8 import decode_e4m3, encode_e4m3

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLOAT32_MAX = torch.finfo(torch.float32).max
# Magnitude of each 3-bit E2M1 code; bit 3 of a code is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoint between code k and k+1. A tie rounds to the even code: up from odd k, down from even k.
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


@dataclass
class Nvfp4Tensor:
    """A quantized [..., D] tensor: packed codes, per-block scales and the per-tensor scale."""

    packed: torch.Tensor  # uint8 [..., D // 2]: element 2i in the low nibble, 2i+1 in the high nibble
    block_scales: torch.Tensor  # uint8 [..., D // 16]: E4M3 bytes
    global_scale: float  # an FP32 value: 448 * 6 / amax

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 2)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.block_scales.numel()


def check_quantizable(x: torch.Tensor) -> None:
    """Raises ValueError naming the problem if NVFP4 cannot encode `x`."""
    if not x.is_floating_point():
        raise ValueError(f"NVFP4 quantizes floating-point tensors, got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % BLOCK_SIZE != 0:
        shape = tuple(x.shape)
        raise ValueError(f"NVFP4 needs the last dimension to be a multiple of {BLOCK_SIZE}, got shape {shape}")
    non_finite = int((~torch.isfinite(x)).sum())
    if non_finite:
        raise ValueError(f"NVFP4 cannot encode NaN or inf: the input holds {non_finite} non-finite values")


def check_global_scale(global_scale: float) -> None:
    if not (0.0 < global_scale < float("inf")):
        raise ValueError(f"the NVFP4 global scale must be positive and finite, got {global_scale}")


def global_scale_for(x: torch.Tensor) -> float:
    """448 * 6 / amax(|x|) in FP32; 1.0 for an all-zero tensor, capped at the FP32 maximum."""
    amax = x.detach().abs().max().float() if x.numel() else torch.tensor(0.0)
    if amax == 0:
        return 1.0
    scale = torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32) / amax
    return min(scale.item(), FLOAT32_MAX)


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """float32 -> uint8 E2M1 codes (0..15), nearest-even, saturating at 6. -0 encodes as +0."""
    magnitude = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for k, midpoint in enumerate(E2M1_MIDPOINTS):
        round_up = magnitude >= midpoint if k % 2 else magnitude > midpoint
        code += round_up.to(torch.uint8)
    negative = (v < 0) & (code > 0)
    return code | (negative.to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes -> float32."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    magnitude = values[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D // 2] bytes; element 2i in the low nibble, 2i+1 in the high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., D // 2] bytes -> [..., D] codes (inverse of pack_nibbles)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def quantize(x: torch.Tensor, global_scale: float | None = None) -> Nvfp4Tensor:
    """Quantizes [..., D] to NVFP4. Without `global_scale`, it is computed from amax(|x|)."""
    check_quantizable(x)
    if global_scale is None:
        global_scale = global_scale_for(x)
    check_global_scale(global_scale)
    blocks = x.float().unflatten(-1, (-1, BLOCK_SIZE))
    scale_codes, block_scale = _block_scales(blocks.abs().amax(-1), global_scale)
    scale = block_scale.unsqueeze(-1)
    scaled = torch.where(scale > 0, blocks / scale, torch.zeros_like(blocks))
    codes = encode_e2m1(scaled).flatten(-2)
    return Nvfp4Tensor(pack_nibbles(codes), scale_codes, global_scale)


def dequantize(q: Nvfp4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NVFP4 -> [..., D] tensor of `dtype`."""
    _check_packed(q)
    values = decode_e2m1(unpack_nibbles(q.packed)).unflatten(-1, (-1, BLOCK_SIZE))
    g = torch.tensor(q.global_scale, dtype=torch.float32)
    block_scale = decode_e4m3(q.block_scales) / g
    return (values * block_scale.unsqueeze(-1)).flatten(-2).to(dtype)


def _block_scales(block_amax: torch.Tensor, global_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 bytes of each block's scale, and the FP32 factor (block_scale / global) they decode to."""
    g = torch.tensor(global_scale, dtype=torch.float32)
    codes = encode_e4m3(block_amax / E2M1_MAX * g)
    return codes, decode_e4m3(codes) / g


def _check_packed(q: Nvfp4Tensor) -> None:
    if q.packed.dtype != torch.uint8 or q.block_scales.dtype != torch.uint8:
        raise ValueError(f"NVFP4 packed data and scales must be uint8, got {q.packed.dtype}, {q.block_scales.dtype}")
    expected = (*q.packed.shape[:-1], q.packed.shape[-1] * 2 // BLOCK_SIZE)
    if q.packed.shape[-1] % (BLOCK_SIZE // 2) or tuple(q.block_scales.shape) != expected:
        raise ValueError(
            f"NVFP4 scales shape {tuple(q.block_scales.shape)} does not match packed shape "
            f"{tuple(q.packed.shape)} (expected {expected})"
        )
    check_global_scale(q.global_scale)
