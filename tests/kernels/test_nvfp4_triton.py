"""The Triton NVFP4 codec is bit-identical to the reference (interpreted on CPU, compiled on GPU)."""

import pytest
import torch
import triton
import triton.language as tl

from kernels import nvfp4, nvfp4_triton
from kernels.fp8 import encode_e4m3


@triton.jit
def _e4m3_encode_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + offsets, nvfp4_triton.e4m3_encode_positive(x).to(tl.uint8), mask=offsets < n)


def e4m3_grid() -> torch.Tensor:
    """All finite non-negative E4M3 values."""
    return torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def test_integer_e4m3_encoding_matches_torch_cast_including_ties(device):
    grid = e4m3_grid()
    midpoints = (grid[1:] + grid[:-1]) / 2
    nudged = torch.cat((midpoints * (1 + 2**-20), midpoints * (1 - 2**-20)))
    x = torch.cat((grid, midpoints, nudged, torch.logspace(-12, 3, 2000), torch.tensor([448.0, 463.9, 1e30])))
    out = torch.empty(x.shape, dtype=torch.uint8, device=device)
    _e4m3_encode_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(device), out, x.numel(), BLOCK=1024)
    assert torch.equal(out.cpu(), encode_e4m3(x))


def interesting_tensors():
    torch.manual_seed(0)
    wide = torch.randn(33, 64) * torch.logspace(-8, 4, 64)  # block scales from subnormal E4M3 to 448
    ties = (torch.tensor(nvfp4.E2M1_MIDPOINTS * 2 + (6.0, -6.0)) * 1.0).repeat(5, 1)  # 16 per row
    zero_blocks = torch.cat((torch.zeros(4, 16), torch.randn(4, 16)), dim=-1)
    return [
        (wide, torch.float32),
        (wide, torch.bfloat16),
        (torch.randn(2, 3, 7, 48), torch.float16),
        (ties, torch.float32),
        (zero_blocks, torch.float32),
    ]


@pytest.mark.parametrize("x, dtype", interesting_tensors())
def test_triton_quantize_is_bit_identical_to_reference(x, dtype, device):
    x = x.to(dtype)
    expected = nvfp4.quantize(x)
    got = nvfp4_triton.quantize(x.to(device))
    assert got.global_scale == expected.global_scale
    assert torch.equal(got.packed.cpu(), expected.packed)
    assert torch.equal(got.block_scales.cpu(), expected.block_scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_dequantize_is_bit_identical_to_reference(dtype, device):
    torch.manual_seed(1)
    q = nvfp4.quantize(torch.randn(9, 128) * torch.logspace(-4, 2, 128))
    on_device = nvfp4.Nvfp4Tensor(q.packed.to(device), q.block_scales.to(device), q.global_scale)
    assert torch.equal(nvfp4_triton.dequantize(on_device, dtype).cpu(), nvfp4.dequantize(q, dtype))


def test_triton_quantize_with_a_given_global_scale_saturates_like_reference(device):
    x = torch.randn(4, 32) * 100
    expected = nvfp4.quantize(x, global_scale=1000.0)  # far too large: block scales saturate at 448
    got = nvfp4_triton.quantize(x.to(device), global_scale=1000.0)
    assert expected.block_scales.max().item() == 126  # E4M3 448
    assert torch.equal(got.packed.cpu(), expected.packed)
    assert torch.equal(got.block_scales.cpu(), expected.block_scales)


def test_triton_codec_rejects_non_finite_input(device):
    x = torch.ones(2, 16, device=device)
    x[1, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        nvfp4_triton.quantize(x)
