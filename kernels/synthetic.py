"""Random decode batches shaped like serving traffic, built once for the GPU tests and benchmarks."""

import math
from typing import NamedTuple

import torch

from kernels import page_codec


class PagedDecodeBatch(NamedTuple):
    """The arguments of attention_triton.paged_decode_attention, in order."""

    q: torch.Tensor  # [batch, q_heads, head_dim] bf16, one decode token per sequence
    pages: torch.Tensor  # [num_blocks, 2, page_size, kv_heads, row bytes] NVFP4 K and V
    block_table: torch.Tensor  # [batch, blocks_per_seq] int32
    seq_lens: torch.Tensor  # [batch] int32
    scales: page_codec.PageScales


def paged_decode_batch(batch: int, seq_len: int, *, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                       page_size: int = 64, device: str = "cuda", seed: int = 0) -> PagedDecodeBatch:
    """Every sequence `seq_len` long, its blocks scattered over the cache (a permuted block table)."""
    torch.manual_seed(seed)
    blocks_per_seq = math.ceil(seq_len / page_size)
    num_blocks = batch * blocks_per_seq
    k = torch.randn(num_blocks, page_size, kv_heads, head_dim, device=device)
    v = torch.randn(num_blocks, page_size, kv_heads, head_dim, device=device)
    scales = page_codec.PageScales.calibrate(k, v)
    pages = torch.stack(
        (page_codec.encode_heads(k, scales.k_global_scale), page_codec.encode_heads(v, scales.v_global_scale)), dim=1
    )
    block_table = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).int()
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    q = torch.randn(batch, q_heads, head_dim, device=device, dtype=torch.bfloat16)
    return PagedDecodeBatch(q, pages, block_table, seq_lens, scales)
