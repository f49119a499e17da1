"""Sizes of stored blocks and tier capacity in tokens (what `rollout-serve up` logs, what benchmarks report)."""

import pytest

from engine.kv_tier.formats import (
    KvShape,
    bytes_per_token,
    capacity_report,
    object_bytes,
    slot_bytes,
    tier_capacity_tokens,
)

TINY = KvShape(num_layers=4, num_kv_heads=2, head_dim=64)  # tiny Qwen2
GIB = 2**30


def test_shape_from_a_hugging_face_config():
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256}
    assert KvShape.from_hf_config(config) == TINY
    assert KvShape.from_hf_config({**config, "head_dim": 128}).head_dim == 128


def test_object_bytes_per_format_for_the_tiny_model():
    # 4 layers x 2 heads x 32 tokens x (K, V): 512 vectors of 64 values.
    assert object_bytes(TINY, 32, "float32") == 512 * 64 * 4
    assert object_bytes(TINY, 32, "bfloat16") == 512 * 64 * 2
    assert object_bytes(TINY, 32, "nvfp4") == 512 * (32 + 4)  # 36-byte rows; global scales in the sign bits


def test_capacity_counts_whole_blocks():
    per_block = object_bytes(TINY, 32, "bfloat16")
    assert tier_capacity_tokens(10 * per_block + per_block - 1, TINY, 32, "bfloat16") == 10 * 32
    assert bytes_per_token(TINY, 32, "bfloat16") == 2048


def test_a_slot_is_the_smallest_mooncake_allocator_bin_that_fits():
    # Bins keep four significant binary digits: 18,464 = 0b100_1000_0010_0000 -> 0b101 << 12 = 20,480.
    assert slot_bytes(18_464) == 20_480
    assert [slot_bytes(n) for n in (18_432, 65_536, 15)] == [18_432, 65_536, 15]  # bins already
    assert slot_bytes(65_537) == 9 << 13
    for size in range(16, 5000):
        slot = slot_bytes(size)
        assert size <= slot <= size * 1.125 and slot >> (slot.bit_length() - 4) << (slot.bit_length() - 4) == slot


def test_nvfp4_holds_3_55x_the_tokens_of_bf16_in_their_slots():
    # NVFP4 blocks (18,432 bytes) and bf16 blocks (65,536) are allocator bins already: no padding.
    report = capacity_report(GIB, TINY, 32)
    assert report["tier_tokens_ratio_nvfp4_over_bf16"] == pytest.approx(65_536 / 18_432, rel=1e-3)
    assert report["tier_tokens_bf16"] == GIB // 2048


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown KV format"):
        object_bytes(TINY, 32, "int3")
