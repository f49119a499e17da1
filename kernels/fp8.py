"""FP8 E4M3 (the OCP `e4m3fn` variant): the byte format of NVFP4 block scales and of MLA RoPE dims.

Every FP8 value in this package is stored as its raw byte (torch.uint8), so byte buffers
(pages, MLA rows) can hold them next to packed E2M1 nibbles. Encoding rounds to nearest,
ties to even, and saturates at +-448 (E4M3 has no infinity; 0x7F/0xFF are NaN and never produced).
"""

import torch

E4M3_MAX = 448.0


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Float tensor -> uint8 E4M3 bytes (round to nearest even, saturating)."""
    clamped = x.float().clamp(-E4M3_MAX, E4M3_MAX)
    return clamped.to(torch.float8_e4m3fn).view(torch.uint8)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E4M3 bytes -> float32."""
    return codes.view(torch.float8_e4m3fn).float()


def fp8_scale_for(x: torch.Tensor) -> float:
    """Per-tensor scale that maps amax(|x|) onto the E4M3 maximum (1.0 for an all-zero tensor)."""
    amax = x.abs().max().float().item() if x.numel() else 0.0
    return amax / E4M3_MAX if amax > 0 else 1.0


def fp8_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x -> E4M3 bytes of x / scale."""
    return encode_e4m3(x.float() / scale)


def fp8_dequantize(codes: torch.Tensor, scale: float) -> torch.Tensor:
    return decode_e4m3(codes) * scale
