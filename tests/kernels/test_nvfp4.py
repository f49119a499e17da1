"""The NVFP4 reference codec: grid rounding, scale rules, byte order, round trips, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import nvfp4
from kernels.fp8 import decode_e4m3, encode_e4m3

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.0, 0.0), (0.24, 0.0), (0.25, 0.0), (0.26, 0.5), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0),
        (2.5, 2.0), (2.51, 3.0), (3.5, 4.0), (5.0, 4.0), (5.01, 6.0), (6.0, 6.0), (1e9, 6.0),
        (-0.75, -1.0), (-5.0, -4.0), (-7.0, -6.0),
    ],
)
def test_e2m1_rounds_to_nearest_even_and_saturates(value, expected):
    code = nvfp4.encode_e2m1(torch.tensor([value]))
    assert nvfp4.decode_e2m1(code).item() == expected


def test_negative_values_rounding_to_zero_encode_as_plus_zero():
    assert nvfp4.encode_e2m1(torch.tensor([-0.1, -0.0])).tolist() == [0, 0]


def test_scale_rules_follow_nvidia_recipe():
    x = torch.zeros(2, 16)
    x[0, 0], x[0, 1] = 1.0, -2688.0  # tensor amax 2688 -> global scale 448 * 6 / 2688 = 1
    x[1, 0] = 3.0  # block amax 3 -> block scale 3 / 6 * 1 = 0.5
    q = nvfp4.quantize(x)
    assert q.global_scale == 1.0
    assert decode_e4m3(q.block_scales).flatten().tolist() == [448.0, 0.5]
    # x / (448 / 1): 1/448 rounds to 0, -2688/448 = -6 -> code 0b1111 in the high nibble of byte 0.
    assert q.packed[0, 0].item() == 0xF0
    # 3 / 0.5 = 6 -> code 7 in the low nibble.
    assert q.packed[1, 0].item() == 0x07


def test_byte_order_is_even_element_in_low_nibble():
    codes = torch.tensor([[2, 15] + [0] * 14], dtype=torch.uint8)
    packed = nvfp4.pack_nibbles(codes)
    assert packed[0, 0].item() == 0xF2
    assert torch.equal(nvfp4.unpack_nibbles(packed), codes)


@PROPERTY_SETTINGS
@given(st.lists(st.integers(0, 255), min_size=8, max_size=64).filter(lambda b: len(b) % 8 == 0))
def test_unpack_then_pack_is_bit_exact(byte_values):
    packed = torch.tensor(byte_values, dtype=torch.uint8)
    assert torch.equal(nvfp4.pack_nibbles(nvfp4.unpack_nibbles(packed)), packed)


@st.composite
def nvfp4_tensors(draw):
    """Quantized tensors drawn directly: codes with a +-6 in every block (the code quantize gives the
    block maximum), normal E4M3 block scales, and a global scale."""
    num_blocks = draw(st.integers(1, 6))
    codes = draw(st.lists(st.integers(0, 15).filter(lambda c: c != 8), min_size=16 * num_blocks, max_size=16 * num_blocks))
    codes = torch.tensor(codes, dtype=torch.uint8).view(num_blocks, 16)
    peaks = draw(st.lists(st.sampled_from([7, 15]), min_size=num_blocks, max_size=num_blocks))
    positions = draw(st.lists(st.integers(0, 15), min_size=num_blocks, max_size=num_blocks))
    codes[torch.arange(num_blocks), torch.tensor(positions)] = torch.tensor(peaks, dtype=torch.uint8)
    scales = torch.tensor(draw(st.lists(st.integers(8, 126), min_size=num_blocks, max_size=num_blocks)), dtype=torch.uint8)
    global_scale = torch.tensor(draw(st.floats(1e-3, 1e6)), dtype=torch.float32).item()
    return nvfp4.Nvfp4Tensor(nvfp4.pack_nibbles(codes).view(1, -1), scales.view(1, -1), global_scale)


@PROPERTY_SETTINGS
@given(nvfp4_tensors())
def test_quantize_of_dequantize_gives_back_the_same_bytes(q):
    again = nvfp4.quantize(nvfp4.dequantize(q), q.global_scale)
    assert torch.equal(again.packed, q.packed)
    assert torch.equal(again.block_scales, q.block_scales)


@PROPERTY_SETTINGS
@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=16, max_size=64).filter(lambda v: len(v) % 16 == 0),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_quantization_error_is_within_half_a_grid_step(values, dtype):
    x = torch.tensor(values).to(dtype).view(-1, 16)
    q = nvfp4.quantize(x)
    error = (nvfp4.dequantize(q) - x.float()).abs()
    step = decode_e4m3(q.block_scales) / q.global_scale  # [blocks, 1]: one unit of the E2M1 grid
    # The largest gap on the grid is 2 (between 4 and 6); beyond 6 units a value saturates.
    bound = torch.maximum(step, x.float().abs().amax(-1, keepdim=True) - 6 * step)
    assert bool((error <= bound * (1 + 1e-6) + 1e-30).all())


def test_block_scale_bytes_are_e4m3_of_block_amax_over_6_times_global():
    torch.manual_seed(0)
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 8).unsqueeze(-1)
    q = nvfp4.quantize(x)
    expected = encode_e4m3(x.view(8, 4, 16).abs().amax(-1) / 6 * q.global_scale)
    assert torch.equal(q.block_scales, expected)
    assert q.global_scale == pytest.approx(448 * 6 / x.abs().max().item(), rel=1e-6)


def test_shapes_and_sizes():
    q = nvfp4.quantize(torch.randn(3, 5, 32))
    assert q.packed.shape == (3, 5, 16) and q.block_scales.shape == (3, 5, 2)
    assert q.shape == (3, 5, 32) and q.nbytes == 3 * 5 * 18


def test_all_zero_tensor_round_trips_to_zeros():
    q = nvfp4.quantize(torch.zeros(2, 16))
    assert q.global_scale == 1.0
    assert torch.equal(nvfp4.dequantize(q), torch.zeros(2, 16))


@pytest.mark.parametrize(
    "x, message",
    [
        (torch.randn(4, 20), "multiple of 16"),
        (torch.tensor([float("nan")] + [0.0] * 15), "NaN or inf"),
        (torch.tensor([float("inf"), float("-inf")] + [0.0] * 14), "2 non-finite"),
        (torch.ones(16, dtype=torch.int32), "floating-point"),
        (torch.tensor(1.0), "multiple of 16"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(x, message):
    with pytest.raises(ValueError, match=message):
        nvfp4.quantize(x)


@pytest.mark.parametrize("global_scale", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_global_scale_is_rejected(global_scale):
    with pytest.raises(ValueError, match="global scale"):
        nvfp4.quantize(torch.ones(16), global_scale)


def test_mismatched_scales_are_rejected():
    q = nvfp4.quantize(torch.ones(2, 32))
    with pytest.raises(ValueError, match="does not match"):
        nvfp4.dequantize(nvfp4.Nvfp4Tensor(q.packed, q.block_scales[:, :1], q.global_scale))
