"""Decode attention straight from NVFP4 KV, in Triton.

K/V bytes are loaded from the cache, unpacked and scaled on-chip, cast to the query's dtype
(FP16/BF16) for the tensor-core dots, and accumulated in FP32 with an online softmax. The KV
cache is never materialised in 16 bits.

Packed bytes hold element 2i in the low nibble and 2i+1 in the high one, so instead of
interleaving nibbles the kernels split the head dimension into even and odd halves:
q.k = q_even.k_low + q_odd.k_high, and the output's even/odd halves are p @ v_low and p @ v_high.

Note: under TRITON_INTERPRET=1 (CPU), Triton 3.x computes tl.dot on bfloat16 wrongly, so the
CPU tests use FP16 queries; BF16 is checked on the GPU (tests marked gpu).
"""

import functools
import math

import torch
import triton
import triton.language as tl

from kernels import mla_codec, page_codec
from kernels.mla_codec import MlaScales
from kernels.nvfp4_triton import e2m1_decode, e4m3_decode
from kernels.page_codec import PageScales

MLA_BLOCK_N = 32  # selected slots per iteration of the sparse-MLA kernel


@triton.jit
def load_nvfp4_rows(row_ptrs, row_ok, scales_offset, inv_global_scale, HALF_DIM: tl.constexpr):
    """NVFP4 vectors starting at row_ptrs [N] -> (even elements, odd elements), each FP32 [N, HALF_DIM]."""
    j = tl.arange(0, HALF_DIM)
    packed = tl.load(row_ptrs[:, None] + j[None, :], mask=row_ok[:, None], other=0).to(tl.int32)
    scale_codes = tl.load(row_ptrs[:, None] + scales_offset + j[None, :] // 8, mask=row_ok[:, None], other=0)
    block_scale = e4m3_decode(scale_codes.to(tl.int32)) * inv_global_scale
    return e2m1_decode(packed & 15) * block_scale, e2m1_decode(packed >> 4) * block_scale


@triton.jit
def _paged_decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    inv_k_scale, inv_v_scale, sm_scale,
    stride_q_batch, stride_q_head, stride_cache_block, stride_cache_kv, stride_cache_token,
    stride_table_batch, num_q_heads, num_splits, chunks_per_split,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HALF_DIM: tl.constexpr, ROW_BYTES: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    batch, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    heads = kv_head * GROUP + tl.arange(0, BLOCK_H)
    head_ok = tl.arange(0, BLOCK_H) < GROUP
    j = tl.arange(0, HALF_DIM)
    q_rows = q_ptr + batch * stride_q_batch + heads[:, None] * stride_q_head + 2 * j[None, :]
    q_even = tl.load(q_rows, mask=head_ok[:, None], other=0.0)
    q_odd = tl.load(q_rows + 1, mask=head_ok[:, None], other=0.0)
    dtype = q_even.dtype

    seq_len = tl.load(seq_lens_ptr + batch)
    first_chunk = split * chunks_per_split
    last_chunk = tl.minimum(first_chunk + chunks_per_split, tl.cdiv(seq_len, PAGE_SIZE))
    m_i = tl.full([BLOCK_H], -1e30, tl.float32)  # finite, so exp(m_old - m_new) never sees inf - inf
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_even = tl.zeros([BLOCK_H, HALF_DIM], tl.float32)
    acc_odd = tl.zeros([BLOCK_H, HALF_DIM], tl.float32)
    tokens_in_page = tl.arange(0, PAGE_SIZE)
    for chunk in range(first_chunk, last_chunk):
        block = tl.load(block_table_ptr + batch * stride_table_batch + chunk).to(tl.int64)
        token_ok = chunk * PAGE_SIZE + tokens_in_page < seq_len
        rows = cache_ptr + block * stride_cache_block + tokens_in_page * stride_cache_token + kv_head * ROW_BYTES
        k_even, k_odd = load_nvfp4_rows(rows, token_ok, HALF_DIM, inv_k_scale, HALF_DIM)
        scores = tl.dot(q_even, tl.trans(k_even.to(dtype))) + tl.dot(q_odd, tl.trans(k_odd.to(dtype)))
        scores = tl.where(token_ok[None, :], scores * sm_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_even, v_odd = load_nvfp4_rows(rows + stride_cache_kv, token_ok, HALF_DIM, inv_v_scale, HALF_DIM)
        acc_even = acc_even * alpha[:, None] + tl.dot(p.to(dtype), v_even.to(dtype))
        acc_odd = acc_odd * alpha[:, None] + tl.dot(p.to(dtype), v_odd.to(dtype))
        m_i = m_new

    # Partial result of this split: normalised output and its log-sum-exp (-inf when empty).
    has_keys = l_i > 0
    safe_l = tl.where(has_keys, l_i, 1.0)
    partial = (batch * num_q_heads + heads) * num_splits + split
    out_rows = out_ptr + partial[:, None] * (2 * HALF_DIM) + 2 * j[None, :]
    tl.store(out_rows, acc_even / safe_l[:, None], mask=head_ok[:, None])
    tl.store(out_rows + 1, acc_odd / safe_l[:, None], mask=head_ok[:, None])
    lse = tl.where(has_keys, m_i + tl.log(safe_l), float("-inf"))
    tl.store(lse_ptr + partial, lse, mask=head_ok)


def paged_decode_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scales: PageScales,
    sm_scale: float | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Fused NVFP4 decode attention. q [B, Hq, D] fp16/bf16; kv_pages uint8 [num_blocks, 2, page_size,
    Hkv, row_bytes(D)]; block_table int32 [B, max_blocks]; seq_lens int32 [B]. Returns [B, Hq, D] in
    q's dtype. The sequence is cut into `num_splits` parts attended in parallel, then merged."""
    longest = int(seq_lens.max()) if seq_lens.numel() else 0  # the one read back from the device
    _check_paged_inputs(q, kv_pages, block_table, seq_lens, longest)
    partial_out, partial_lse = paged_decode_splits(
        q.contiguous(), kv_pages.contiguous(), block_table.contiguous(), seq_lens.contiguous(), scales, sm_scale,
        num_splits, max_chunks=max(1, math.ceil(longest / kv_pages.shape[2])))
    return merge_splits(partial_out, partial_lse).to(q.dtype)


def paged_decode_splits(q, kv_pages, block_table, seq_lens, scales: PageScales, sm_scale: float | None,
                        num_splits: int | None, max_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel launch alone, on checked contiguous inputs: each split's normalised output
    [B, Hq, S, D] (float32) and log-sum-exp [B, Hq, S]."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, page_size = kv_pages.shape[3], kv_pages.shape[2]
    group = num_q_heads // num_kv_heads
    if num_splits is None:
        num_splits = _default_splits(batch * num_kv_heads, max_chunks, q.device)
    num_splits = max(1, min(num_splits, max_chunks))
    chunks_per_split = math.ceil(max_chunks / num_splits)
    partial_out = torch.empty((batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    if batch:
        _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
            q, kv_pages, block_table, seq_lens, partial_out, partial_lse,
            1.0 / scales.k_global_scale, 1.0 / scales.v_global_scale, sm_scale,
            q.stride(0), q.stride(1), kv_pages.stride(0), kv_pages.stride(1), kv_pages.stride(2),
            block_table.stride(0), num_q_heads, num_splits, chunks_per_split,
            GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HALF_DIM=head_dim // 2,
            ROW_BYTES=page_codec.row_bytes(head_dim), PAGE_SIZE=page_size,
        )
    return partial_out, partial_lse


def merge_splits(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
    """Combines per-split softmax results [..., S, D] weighted by their log-sum-exp [..., S]."""
    lse_max = partial_lse.amax(dim=-1, keepdim=True)
    lse_max = torch.where(torch.isfinite(lse_max), lse_max, torch.zeros_like(lse_max))
    weights = torch.exp(partial_lse - lse_max)  # 0 for empty splits
    total = weights.sum(dim=-1, keepdim=True)
    weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    return (partial_out.nan_to_num() * weights.unsqueeze(-1)).sum(dim=-2)


def _default_splits(programs: int, max_chunks: int, device: torch.device) -> int:
    """Enough splits to give every GPU SM about two programs (1 on CPU, where it buys nothing)."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, min(max_chunks, math.ceil(2 * _multiprocessors(index) / max(programs, 1))))


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check_paged_inputs(q, kv_pages, block_table, seq_lens, longest: int) -> None:
    if q.ndim != 3 or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"q must be fp16/bf16 [batch, q_heads, head_dim], got {q.dtype} {tuple(q.shape)}")
    head_dim = q.shape[-1]
    expected_row = page_codec.row_bytes(head_dim)
    if kv_pages.dtype != torch.uint8 or kv_pages.ndim != 5 or kv_pages.shape[1] != 2 or kv_pages.shape[-1] != expected_row:
        raise ValueError(
            f"kv_pages must be uint8 [num_blocks, 2, page_size, kv_heads, {expected_row}] for head_dim "
            f"{head_dim}, got {kv_pages.dtype} {tuple(kv_pages.shape)}"
        )
    page_size, num_kv_heads = kv_pages.shape[2], kv_pages.shape[3]
    if q.shape[1] % num_kv_heads:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of KV heads ({num_kv_heads})")
    if page_size < 16 or page_size & (page_size - 1) or head_dim < 32:
        raise ValueError(f"the kernel needs a power-of-two page size >= 16 and head_dim >= 32, got {page_size}, {head_dim}")
    if block_table.ndim != 2 or block_table.shape[0] != q.shape[0] or seq_lens.shape != (q.shape[0],):
        raise ValueError(
            f"block_table must be [batch, max_blocks] and seq_lens [batch] for batch {q.shape[0]}, "
            f"got {tuple(block_table.shape)} and {tuple(seq_lens.shape)}"
        )
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError(f"block_table and seq_lens must be int32, got {block_table.dtype}, {seq_lens.dtype}")
    if longest > block_table.shape[1] * page_size:
        raise ValueError(f"a sequence of {longest} tokens does not fit the block table's "
                         f"{block_table.shape[1]} blocks of {page_size}")


@triton.jit
def _sparse_mla_kernel(
    q_latent_ptr, q_rope_ptr, cache_ptr, indices_ptr, out_ptr,
    inv_latent_scale, rope_scale, sm_scale, num_heads, num_selected,
    stride_ql_token, stride_ql_head, stride_qr_token, stride_qr_head, stride_idx_token,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HALF_LATENT: tl.constexpr, ROPE_DIM: tl.constexpr,
    SCALES_OFFSET: tl.constexpr, ROPE_OFFSET: tl.constexpr, ROW_BYTES: tl.constexpr,
):
    token, head_block = tl.program_id(0), tl.program_id(1)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    j = tl.arange(0, HALF_LATENT)
    r = tl.arange(0, ROPE_DIM)
    q_rows = q_latent_ptr + token * stride_ql_token + heads[:, None] * stride_ql_head + 2 * j[None, :]
    q_even = tl.load(q_rows, mask=head_ok[:, None], other=0.0)
    q_odd = tl.load(q_rows + 1, mask=head_ok[:, None], other=0.0)
    q_rope_rows = q_rope_ptr + token * stride_qr_token + heads[:, None] * stride_qr_head + r[None, :]
    q_rope = tl.load(q_rope_rows, mask=head_ok[:, None], other=0.0)
    dtype = q_even.dtype

    m_i = tl.full([BLOCK_H], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_even = tl.zeros([BLOCK_H, HALF_LATENT], tl.float32)
    acc_odd = tl.zeros([BLOCK_H, HALF_LATENT], tl.float32)
    for start in range(0, num_selected, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        slots = tl.load(indices_ptr + token * stride_idx_token + n, mask=n < num_selected, other=-1)
        slot_ok = slots >= 0
        if tl.sum(slot_ok.to(tl.int32)) > 0:  # an all-empty chunk costs one index load
            rows = cache_ptr + tl.where(slot_ok, slots, 0).to(tl.int64) * ROW_BYTES
            c_even, c_odd = load_nvfp4_rows(rows, slot_ok, SCALES_OFFSET, inv_latent_scale, HALF_LATENT)
            rope_codes = tl.load(rows[:, None] + ROPE_OFFSET + r[None, :], mask=slot_ok[:, None], other=0)
            k_rope = e4m3_decode(rope_codes.to(tl.int32)) * rope_scale
            c_even, c_odd = c_even.to(dtype), c_odd.to(dtype)
            scores = tl.dot(q_even, tl.trans(c_even)) + tl.dot(q_odd, tl.trans(c_odd))
            scores += tl.dot(q_rope, tl.trans(k_rope.to(dtype)))
            scores = tl.where(slot_ok[None, :], scores * sm_scale, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc_even = acc_even * alpha[:, None] + tl.dot(p.to(dtype), c_even)
            acc_odd = acc_odd * alpha[:, None] + tl.dot(p.to(dtype), c_odd)
            m_i = m_new

    safe_l = tl.where(l_i > 0, l_i, 1.0)  # a token with no selected slot gets zeros
    out_rows = out_ptr + (token * num_heads + heads)[:, None] * (2 * HALF_LATENT) + 2 * j[None, :]
    out_type = out_ptr.dtype.element_ty
    tl.store(out_rows, (acc_even / safe_l[:, None]).to(out_type), mask=head_ok[:, None])
    tl.store(out_rows + 1, (acc_odd / safe_l[:, None]).to(out_type), mask=head_ok[:, None])


def sparse_mla_attention(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache_rows: torch.Tensor,
    slot_indices: torch.Tensor,
    scales: MlaScales,
    sm_scale: float,
) -> torch.Tensor:
    """Sparse MLA decode from 352-byte NVFP4 rows. q_latent [T, H, 512] and q_rope [T, H, 64] fp16/bf16;
    cache_rows uint8 [num_slots, 352] (a paged cache viewed as slots); slot_indices int32 [T, K], entries
    < 0 empty. Returns [T, H, 512] in q's dtype (FP32 accumulation; zeros for a token with no slot)."""
    _check_sparse_inputs(q_latent, q_rope, cache_rows, slot_indices)
    num_tokens, num_heads, _ = q_latent.shape
    q_latent, q_rope = q_latent.contiguous(), q_rope.contiguous()
    cache_rows, slot_indices = cache_rows.contiguous(), slot_indices.contiguous()
    out = torch.empty(q_latent.shape, dtype=q_latent.dtype, device=q_latent.device)
    block_h = 16
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    if num_tokens:
        _sparse_mla_kernel[grid](
            q_latent, q_rope, cache_rows, slot_indices, out,
            1.0 / scales.latent_global_scale, scales.rope_scale, sm_scale, num_heads, slot_indices.shape[1],
            q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1), slot_indices.stride(0),
            BLOCK_H=block_h, BLOCK_N=MLA_BLOCK_N, HALF_LATENT=mla_codec.LATENT_DIM // 2,
            ROPE_DIM=mla_codec.ROPE_DIM, SCALES_OFFSET=mla_codec.LATENT_SCALES_OFFSET,
            ROPE_OFFSET=mla_codec.ROPE_OFFSET, ROW_BYTES=mla_codec.ROW_BYTES,
            num_warps=8,
        )
    return out


def _check_sparse_inputs(q_latent, q_rope, cache_rows, slot_indices) -> None:
    latent, rope = mla_codec.LATENT_DIM, mla_codec.ROPE_DIM
    if q_latent.ndim != 3 or q_latent.shape[-1] != latent or q_latent.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"q_latent must be fp16/bf16 [tokens, heads, {latent}], got {q_latent.dtype} {tuple(q_latent.shape)}")
    if q_rope.shape != (*q_latent.shape[:2], rope) or q_rope.dtype != q_latent.dtype:
        raise ValueError(f"q_rope must be {q_latent.dtype} [tokens, heads, {rope}], got {q_rope.dtype} {tuple(q_rope.shape)}")
    if cache_rows.dtype != torch.uint8 or cache_rows.ndim != 2 or cache_rows.shape[1] != mla_codec.ROW_BYTES:
        raise ValueError(f"cache_rows must be uint8 [num_slots, {mla_codec.ROW_BYTES}], got {cache_rows.dtype} {tuple(cache_rows.shape)}")
    if slot_indices.dtype != torch.int32 or slot_indices.ndim != 2 or slot_indices.shape[0] != q_latent.shape[0]:
        raise ValueError(f"slot_indices must be int32 [tokens, K], got {slot_indices.dtype} {tuple(slot_indices.shape)}")
    if slot_indices.numel() and int(slot_indices.max()) >= cache_rows.shape[0]:
        raise ValueError(f"slot index {int(slot_indices.max())} is out of range for a cache of {cache_rows.shape[0]} slots")


def staged_decode_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scales: PageScales,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The baseline the fused kernel is measured against: gather each sequence's pages, dequantize
    them to q's dtype with the Triton codec, then run PyTorch's scaled_dot_product_attention."""
    from kernels import nvfp4_triton  # noqa: PLC0415 (only the baseline needs the standalone codec)
    from kernels.nvfp4 import Nvfp4Tensor  # noqa: PLC0415

    max_len = int(seq_lens.max())
    _check_paged_inputs(q, kv_pages, block_table, seq_lens, max_len)
    batch, num_q_heads, head_dim = q.shape
    page_size = kv_pages.shape[2]
    blocks = block_table[:, : math.ceil(max_len / page_size)].long()
    rows = kv_pages[blocks]  # [B, n_blocks, 2, page, Hkv, row]

    def dequantized(kv: int, global_scale: float) -> torch.Tensor:
        part = rows[:, :, kv]
        packed = part[..., : head_dim // 2].contiguous()
        block_scales = part[..., head_dim // 2 :].contiguous()
        x = nvfp4_triton.dequantize(Nvfp4Tensor(packed, block_scales, global_scale), q.dtype)
        return x.flatten(1, 2)[:, :max_len].transpose(1, 2)  # [B, Hkv, L, D]

    k = dequantized(0, scales.k_global_scale)
    v = dequantized(1, scales.v_global_scale)
    mask = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].long()
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :], scale=sm_scale,
        enable_gqa=num_q_heads != k.shape[1],
    )
    return out.squeeze(2)
