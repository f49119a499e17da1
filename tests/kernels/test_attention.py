"""Fused NVFP4 attention kernels against their PyTorch references.

Tolerance: the kernels feed FP16/BF16 operands to the dots (dequantized K/V and softmax weights
rounded to the operand type) and accumulate in FP32; the references compute in FP32 from the
same decoded values. Outputs are O(1) here, and must agree within atol 5e-3, rtol 1e-2 (FP16).
"""

import math

import pytest
import torch

from kernels import attention, attention_triton, mla_codec, page_codec

ATOL, RTOL = 5e-3, 1e-2


def paged_case(batch, q_heads, kv_heads, head_dim, page_size, seq_lens, seed=0):
    torch.manual_seed(seed)
    max_blocks = max(1, max(math.ceil(n / page_size) for n in seq_lens))
    num_blocks = batch * max_blocks + 3
    cache = torch.randn(num_blocks, 2, page_size, kv_heads, head_dim)
    scales = page_codec.PageScales.calibrate(cache[:, 0], cache[:, 1])
    pages = page_codec.encode_kv_cache(cache, scales)
    block_table = torch.randperm(num_blocks)[: batch * max_blocks].view(batch, max_blocks).int()
    q = torch.randn(batch, q_heads, head_dim).half()
    return q, pages, block_table, torch.tensor(seq_lens, dtype=torch.int32), scales, cache


@pytest.mark.parametrize(
    "batch, q_heads, kv_heads, head_dim, page_size, seq_lens, num_splits",
    [
        (3, 4, 2, 64, 32, [37, 64, 1], 1),  # tiny Qwen2 shape: GQA group 2, vLLM block size 32
        (3, 4, 2, 64, 32, [37, 64, 1], 3),  # split across the sequence, then merged
        (2, 7, 1, 32, 16, [50, 16], 2),  # group of 7 padded to 16 query rows
        (2, 3, 3, 128, 16, [20, 33], 1),  # MHA
        (2, 4, 2, 64, 16, [0, 5], 1),  # an empty sequence gives zeros
    ],
)
def test_paged_decode_matches_reference(batch, q_heads, kv_heads, head_dim, page_size, seq_lens, num_splits, device):
    q, pages, block_table, lens, scales, _ = paged_case(batch, q_heads, kv_heads, head_dim, page_size, seq_lens)
    expected = attention.paged_decode_attention_ref(q, pages, block_table, lens, scales)
    got = attention_triton.paged_decode_attention(
        q.to(device), pages.to(device), block_table.to(device), lens.to(device), scales, num_splits=num_splits
    )
    assert got.dtype == torch.float16 and got.shape == q.shape
    torch.testing.assert_close(got.float().cpu(), expected, atol=ATOL, rtol=RTOL)


def test_reference_is_close_to_unquantized_attention():
    """Guards the reference itself: NVFP4 attention stays near attention on the original K/V."""
    q, pages, block_table, lens, scales, original = paged_case(2, 4, 2, 64, 16, [48, 30])
    out = attention.paged_decode_attention_ref(q, pages, block_table, lens, scales)
    for b, n in enumerate(lens.tolist()):
        k, v = attention.gather_pages(original, block_table[b, : math.ceil(n / 16)], n)
        exact, _ = attention.attend(q[b], k, v, 1 / 8)
        assert ((out[b] - exact).norm() / exact.norm()).item() < 0.15


def sparse_case(tokens, heads, num_slots, num_selected, seed=0):
    torch.manual_seed(seed)
    latent, rope = torch.randn(num_slots, 512), torch.randn(num_slots, 64)
    scales = mla_codec.MlaScales.calibrate(latent, rope)
    rows = mla_codec.encode_rows(latent, rope, scales)
    q_latent = (torch.randn(tokens, heads, 512) * 0.5).half()
    q_rope = torch.randn(tokens, heads, 64).half()
    indices = torch.randint(0, num_slots, (tokens, num_selected), dtype=torch.int32)
    return q_latent, q_rope, rows, indices, scales


def test_sparse_mla_matches_reference_and_skips_empty_entries(device):
    q_latent, q_rope, rows, indices, scales = sparse_case(tokens=3, heads=20, num_slots=300, num_selected=2048)
    indices[0, 40:] = -1  # a short list padded with -1, as a top-k indexer returns for short contexts
    indices[1, ::3] = -1  # empty entries scattered through the list
    indices[2, :] = -1  # nothing selected: zeros
    indices[2, 2047] = 7
    sm_scale = 1 / math.sqrt(192)
    expected = attention.sparse_mla_attention_ref(q_latent, q_rope, rows, indices, scales, sm_scale)
    got = attention_triton.sparse_mla_attention(
        q_latent.to(device), q_rope.to(device), rows.to(device), indices.to(device), scales, sm_scale
    )
    assert got.shape == (3, 20, 512) and got.dtype == torch.float16
    torch.testing.assert_close(got.float().cpu(), expected, atol=ATOL, rtol=RTOL)
    # A single selected slot: the output is that slot's latent row.
    latent_7, _ = mla_codec.decode_rows(rows[7], scales)
    torch.testing.assert_close(got[2].float().cpu(), latent_7.expand(20, 512), atol=ATOL, rtol=RTOL)


def test_sparse_mla_token_with_no_selection_gets_zeros(device):
    q_latent, q_rope, rows, indices, scales = sparse_case(tokens=1, heads=16, num_slots=10, num_selected=64)
    indices[:] = -1
    got = attention_triton.sparse_mla_attention(
        q_latent.to(device), q_rope.to(device), rows.to(device), indices.to(device), scales, 0.1
    )
    assert torch.equal(got.cpu(), torch.zeros_like(got.cpu()))


def test_positions_to_slots_maps_through_the_block_table():
    block_table = torch.tensor([5, 2, 9])
    positions = torch.tensor([0, 3, 4, 11, -1])
    slots = attention.positions_to_slots(positions, block_table, block_size=4)
    assert slots.tolist() == [20, 23, 8, 39, -1]


def test_paged_decode_rejects_bad_input():
    q, pages, block_table, lens, scales, _ = paged_case(2, 4, 2, 64, 16, [10, 20])
    with pytest.raises(ValueError, match="fp16/bf16"):
        attention_triton.paged_decode_attention(q.float(), pages, block_table, lens, scales)
    with pytest.raises(ValueError, match="kv_pages must be uint8"):
        attention_triton.paged_decode_attention(q, pages[..., :-1], block_table, lens, scales)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        attention_triton.paged_decode_attention(q[:, :3], pages, block_table, lens, scales)
    with pytest.raises(ValueError, match="does not fit"):
        attention_triton.paged_decode_attention(q, pages, block_table, lens * 10, scales)
    with pytest.raises(ValueError, match="int32"):
        attention_triton.paged_decode_attention(q, pages, block_table.long(), lens, scales)


def test_sparse_mla_rejects_bad_input():
    q_latent, q_rope, rows, indices, scales = sparse_case(tokens=2, heads=16, num_slots=10, num_selected=32)
    with pytest.raises(ValueError, match="out of range"):
        attention_triton.sparse_mla_attention(q_latent, q_rope, rows, indices + 10, scales, 0.1)
    with pytest.raises(ValueError, match="cache_rows"):
        attention_triton.sparse_mla_attention(q_latent, q_rope, rows[:, :300], indices, scales, 0.1)
    with pytest.raises(ValueError, match="q_rope"):
        attention_triton.sparse_mla_attention(q_latent, q_rope[..., :32], rows, indices, scales, 0.1)
    with pytest.raises(ValueError, match="int32"):
        attention_triton.sparse_mla_attention(q_latent, q_rope, rows, indices.long(), scales, 0.1)


def test_staged_baseline_matches_reference(device):
    q, pages, block_table, lens, scales, _ = paged_case(3, 4, 2, 64, 16, [37, 64, 5])
    expected = attention.paged_decode_attention_ref(q, pages, block_table, lens, scales)
    got = attention_triton.staged_decode_attention(q.to(device), pages.to(device), block_table.to(device), lens.to(device), scales)
    torch.testing.assert_close(got.float().cpu(), expected, atol=ATOL, rtol=RTOL)
