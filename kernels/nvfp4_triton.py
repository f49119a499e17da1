"""NVFP4 quantize / dequantize as Triton kernels, plus the element codecs the attention kernels share.

The kernels follow kernels/nvfp4.py operation for operation (IEEE division via div_rn, integer
rounding of E4M3), so their output is bit-identical to the reference. Each program handles
BLOCKS_PER_PROGRAM blocks of 16 elements; a block is loaded as its 8 even and 8 odd elements,
which are exactly the low and high nibbles of its 8 packed bytes.
"""

import torch
import triton
import triton.language as tl

from kernels import nvfp4

BLOCKS_PER_PROGRAM = 128


@triton.jit
def e2m1_encode(v):
    """float32 -> int32 E2M1 codes, nearest-even and saturating (see nvfp4.E2M1_MIDPOINTS)."""
    mag = tl.abs(v)
    code = (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
    code += (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
    code += (mag > 5.0).to(tl.int32)
    negative = (v < 0) & (code > 0)
    return code | (negative.to(tl.int32) << 3)


@triton.jit
def e2m1_decode(code):
    """int32 E2M1 codes -> float32. Codes 2..7 are normal numbers built from their bits."""
    m = code & 7
    normal_bits = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    magnitude = tl.where(m < 2, m.to(tl.float32) * 0.5, normal_bits.to(tl.float32, bitcast=True))
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def e4m3_decode(byte):
    """int32 holding an E4M3 byte -> float32."""
    exponent = (byte >> 3) & 15
    mantissa = byte & 7
    normal_bits = ((exponent + 120) << 23) | (mantissa << 20)
    subnormal = mantissa.to(tl.float32) * 0.001953125  # mantissa * 2^-9
    magnitude = tl.where(exponent == 0, subnormal, normal_bits.to(tl.float32, bitcast=True))
    return tl.where((byte & 128) != 0, -magnitude, magnitude)


@triton.jit
def e4m3_encode_positive(v):
    """float32 >= 0 -> int32 E4M3 byte, nearest-even, saturating at 448; integer rounding, no FP8 casts."""
    v = tl.minimum(v, 448.0)
    bits = v.to(tl.int32, bitcast=True)
    # Normal range: keep 3 mantissa bits, round on the 20 dropped ones; a carry bumps the exponent.
    exponent = (bits >> 23) - 127
    kept = (bits >> 20) & 7
    dropped = bits & 0xFFFFF
    up = (dropped > 0x80000) | ((dropped == 0x80000) & ((kept & 1) == 1))
    normal = ((exponent + 7) << 3) + kept + up.to(tl.int32)
    # Subnormal range (v < 2^-6): the code is v / 2^-9 rounded to an integer (8 is the smallest normal).
    steps = v * 512.0
    whole = steps.to(tl.int32)
    frac = steps - whole.to(tl.float32)
    up_sub = (frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))
    subnormal = whole + up_sub.to(tl.int32)
    return tl.where(v < 0.015625, subnormal, normal)


@triton.jit
def cast_rne(x, dtype: tl.constexpr):
    """float32 -> dtype, rounding to nearest even. For bfloat16 the rounding is done on the bits, since
    Triton's interpreter truncates there while GPUs round; both then agree bit for bit."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _quantize_kernel(x_ptr, packed_ptr, scales_ptr, num_blocks, global_scale, BLOCKS: tl.constexpr):
    blocks = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = blocks < num_blocks
    pairs = tl.arange(0, 8)
    even_offsets = blocks.to(tl.int64)[:, None] * 16 + 2 * pairs[None, :]
    even = tl.load(x_ptr + even_offsets, mask=in_range[:, None], other=0.0).to(tl.float32)
    odd = tl.load(x_ptr + even_offsets + 1, mask=in_range[:, None], other=0.0).to(tl.float32)

    amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))
    scale_code = e4m3_encode_positive(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)) * global_scale)
    block_scale = tl.math.div_rn(e4m3_decode(scale_code), tl.full(amax.shape, 1.0, tl.float32) * global_scale)
    has_scale = block_scale > 0
    divisor = tl.where(has_scale, block_scale, 1.0)[:, None]
    low = e2m1_encode(tl.where(has_scale[:, None], tl.math.div_rn(even, divisor + 0 * even), 0.0))
    high = e2m1_encode(tl.where(has_scale[:, None], tl.math.div_rn(odd, divisor + 0 * odd), 0.0))

    byte_offsets = blocks.to(tl.int64)[:, None] * 8 + pairs[None, :]
    tl.store(packed_ptr + byte_offsets, (low | (high << 4)).to(tl.uint8), mask=in_range[:, None])
    tl.store(scales_ptr + blocks, scale_code.to(tl.uint8), mask=in_range)


@triton.jit
def _dequantize_kernel(packed_ptr, scales_ptr, out_ptr, num_blocks, global_scale, BLOCKS: tl.constexpr):
    blocks = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = blocks < num_blocks
    pairs = tl.arange(0, 8)
    byte_offsets = blocks.to(tl.int64)[:, None] * 8 + pairs[None, :]
    packed = tl.load(packed_ptr + byte_offsets, mask=in_range[:, None], other=0).to(tl.int32)
    scale_code = tl.load(scales_ptr + blocks, mask=in_range, other=0).to(tl.int32)
    block_scale = tl.math.div_rn(e4m3_decode(scale_code), tl.full(scale_code.shape, 1.0, tl.float32) * global_scale)

    even_offsets = blocks.to(tl.int64)[:, None] * 16 + 2 * pairs[None, :]
    out_type = out_ptr.dtype.element_ty
    even = e2m1_decode(packed & 15) * block_scale[:, None]
    odd = e2m1_decode(packed >> 4) * block_scale[:, None]
    tl.store(out_ptr + even_offsets, cast_rne(even, out_type), mask=in_range[:, None])
    tl.store(out_ptr + even_offsets + 1, cast_rne(odd, out_type), mask=in_range[:, None])


def quantize(x: torch.Tensor, global_scale: float | None = None) -> nvfp4.Nvfp4Tensor:
    """Triton twin of nvfp4.quantize (same arguments, bit-identical result)."""
    nvfp4.check_quantizable(x)
    if global_scale is None:
        global_scale = nvfp4.global_scale_for(x)
    nvfp4.check_global_scale(global_scale)
    x = x.contiguous()
    packed = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((*x.shape[:-1], x.shape[-1] // nvfp4.BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    num_blocks = scales.numel()
    if num_blocks:
        grid = (triton.cdiv(num_blocks, BLOCKS_PER_PROGRAM),)
        _quantize_kernel[grid](x, packed, scales, num_blocks, global_scale, BLOCKS=BLOCKS_PER_PROGRAM)
    return nvfp4.Nvfp4Tensor(packed, scales, global_scale)


def dequantize(q: nvfp4.Nvfp4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Triton twin of nvfp4.dequantize."""
    nvfp4._check_packed(q)
    packed, scales = q.packed.contiguous(), q.block_scales.contiguous()
    out = torch.empty(q.shape, dtype=dtype, device=packed.device)
    num_blocks = scales.numel()
    if num_blocks:
        grid = (triton.cdiv(num_blocks, BLOCKS_PER_PROGRAM),)
        _dequantize_kernel[grid](packed, scales, out, num_blocks, q.global_scale, BLOCKS=BLOCKS_PER_PROGRAM)
    return out
