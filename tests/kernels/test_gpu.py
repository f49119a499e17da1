"""Compiled kernels on a CUDA GPU: BF16 paths (the interpreter cannot check BF16 dots), realistic
shapes, and timing of the fused NVFP4 decode kernel against dequantize-then-attend."""

import math

import pytest
import torch
import triton.testing

from kernels import attention, attention_triton, mla_codec, nvfp4, nvfp4_triton, page_codec

pytestmark = pytest.mark.gpu


def decode_case(batch, seq_len, q_heads=32, kv_heads=8, head_dim=128, page_size=64, seed=0):
    """A decode batch with every sequence `seq_len` long, its blocks scattered over the cache."""
    torch.manual_seed(seed)
    blocks_per_seq = math.ceil(seq_len / page_size)
    num_blocks = batch * blocks_per_seq
    k = torch.randn(num_blocks, page_size, kv_heads, head_dim, device="cuda")
    v = torch.randn(num_blocks, page_size, kv_heads, head_dim, device="cuda")
    scales = page_codec.PageScales.calibrate(k, v)
    pages = torch.stack(
        (page_codec.encode_heads(k, scales.k_global_scale), page_codec.encode_heads(v, scales.v_global_scale)), dim=1
    )
    block_table = torch.randperm(num_blocks, device="cuda").view(batch, blocks_per_seq).int()
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, q_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    return q, pages, block_table, seq_lens, scales


def test_quantize_kernel_is_bit_identical_to_reference_on_gpu():
    torch.manual_seed(0)
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16) * torch.logspace(-6, 3, 512, device="cuda").bfloat16()
    expected = nvfp4.quantize(x.cpu())
    got = nvfp4_triton.quantize(x)
    assert torch.equal(got.packed.cpu(), expected.packed)
    assert torch.equal(got.block_scales.cpu(), expected.block_scales)
    assert torch.equal(nvfp4_triton.dequantize(got, torch.bfloat16).cpu(), nvfp4.dequantize(expected, torch.bfloat16))


@pytest.mark.parametrize("batch, seq_len", [(1, 5000), (35, 1000)])
def test_bf16_paged_decode_matches_reference_on_gpu(batch, seq_len):
    q, pages, block_table, seq_lens, scales = decode_case(batch, seq_len)
    seq_lens[0] = seq_len - 17  # a partial last page
    got = attention_triton.paged_decode_attention(q, pages, block_table, seq_lens, scales)
    expected = attention.paged_decode_attention_ref(q.float().cpu(), pages.cpu(), block_table.cpu(), seq_lens.cpu(), scales)
    torch.testing.assert_close(got.float().cpu(), expected, atol=2e-2, rtol=2e-2)  # BF16 operands: 8-bit mantissa
    staged = attention_triton.staged_decode_attention(q, pages, block_table, seq_lens, scales)
    torch.testing.assert_close(staged.float().cpu(), expected, atol=2e-2, rtol=2e-2)


def test_bf16_sparse_mla_matches_reference_on_gpu():
    torch.manual_seed(0)
    num_slots, tokens, heads = 20_000, 4, 128
    latent, rope = torch.randn(num_slots, 512), torch.randn(num_slots, 64)
    scales = mla_codec.MlaScales.calibrate(latent, rope)
    rows = mla_codec.encode_rows(latent, rope, scales)
    indices = torch.randint(0, num_slots, (tokens, 2048), dtype=torch.int32)
    indices[0, 500:] = -1
    indices[1, 1::2] = -1
    q_latent = (torch.randn(tokens, heads, 512) * 0.3).bfloat16()
    q_rope = torch.randn(tokens, heads, 64).bfloat16()
    sm_scale = 1 / math.sqrt(192)
    expected = attention.sparse_mla_attention_ref(q_latent.float(), q_rope.float(), rows, indices, scales, sm_scale)
    got = attention_triton.sparse_mla_attention(q_latent.cuda(), q_rope.cuda(), rows.cuda(), indices.cuda(), scales, sm_scale)
    torch.testing.assert_close(got.float().cpu(), expected, atol=2e-2, rtol=2e-2)


def test_fused_decode_beats_dequantize_then_attend():
    """The point of the fused kernel: reading 4.5-bit KV once beats writing and re-reading BF16."""
    q, pages, block_table, seq_lens, scales = decode_case(batch=35, seq_len=8192)
    fused_ms = triton.testing.do_bench(lambda: attention_triton.paged_decode_attention(q, pages, block_table, seq_lens, scales))
    staged_ms = triton.testing.do_bench(lambda: attention_triton.staged_decode_attention(q, pages, block_table, seq_lens, scales))
    print(f"35 tokens x 8192 context: fused {fused_ms:.3f} ms, staged {staged_ms:.3f} ms")
    assert fused_ms < staged_ms
