"""Compiled kernels on a CUDA GPU: BF16 paths (the interpreter cannot check BF16 dots), realistic
shapes, and timing of the fused NVFP4 decode kernel against dequantize-then-attend."""

import math

import pytest
import torch
import triton.testing

from kernels import attention, attention_triton, mla_codec, nvfp4, nvfp4_triton
from kernels.synthetic import paged_decode_batch

pytestmark = pytest.mark.gpu


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
    q, pages, block_table, seq_lens, scales = paged_decode_batch(batch, seq_len)
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
    q, pages, block_table, seq_lens, scales = paged_decode_batch(35, 8192)
    fused_ms = triton.testing.do_bench(lambda: attention_triton.paged_decode_attention(q, pages, block_table, seq_lens, scales))
    staged_ms = triton.testing.do_bench(lambda: attention_triton.staged_decode_attention(q, pages, block_table, seq_lens, scales))
    print(f"35 tokens x 8192 context: fused {fused_ms:.3f} ms, staged {staged_ms:.3f} ms")
    assert fused_ms < staged_ms
