"""Reference attention in PyTorch (FP32 math) over NVFP4 KV: the ground truth for attention_triton.

Two decode-time shapes:
  * paged decode attention (GQA/MHA): one query token per sequence, K/V in NVFP4 pages
    (kernels/page_codec.py) addressed through a block table;
  * sparse MLA attention: each query token attends only to a list of selected cache slots
    (MLA rows, kernels/mla_codec.py); entries < 0 are empty and skipped.
"""

import math

import torch

from kernels import mla_codec, page_codec
from kernels.mla_codec import MlaScales
from kernels.page_codec import PageScales


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's attention in FP32. q [Hq, D], k/v [n, Hkv, D] with Hq a multiple of Hkv.
    Returns (output [Hq, Dv], weights [Hq, n])."""
    group = q.shape[0] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [n, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q.float(), k) * sm_scale
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hn,nhd->hd", weights, v), weights


def gather_pages(pages: torch.Tensor, block_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Rows of one sequence from a paged cache [num_blocks, 2, block_size, ...] -> [2, seq_len, ...]."""
    selected = pages[block_ids.long()]  # [n_blocks, 2, block_size, ...]
    return selected.transpose(0, 1).flatten(1, 2)[:, :seq_len]


def paged_decode_attention_ref(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scales: PageScales,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """q [B, Hq, D]; kv_pages uint8 [num_blocks, 2, block_size, Hkv, row_bytes]; block_table [B, max_blocks];
    seq_lens [B]. Returns FP32 [B, Hq, D]."""
    head_dim = q.shape[-1]
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    block_size = kv_pages.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        blocks = block_table[b, : math.ceil(seq_len / block_size)].cpu()
        k_rows, v_rows = gather_pages(kv_pages.cpu(), blocks, seq_len)
        k = page_codec.decode_heads(k_rows, scales.k_global_scale)
        v = page_codec.decode_heads(v_rows, scales.v_global_scale)
        out[b], _ = attend(q[b].cpu(), k, v, sm_scale)
    return out


def sparse_mla_attention_ref(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache_rows: torch.Tensor,
    slot_indices: torch.Tensor,
    scales: MlaScales,
    sm_scale: float,
) -> torch.Tensor:
    """q_latent [T, H, 512], q_rope [T, H, 64]; cache_rows uint8 [num_slots, 352]; slot_indices [T, K]
    (entries < 0 are empty). Values are the latent rows. Returns FP32 [T, H, 512]; zeros where a
    token has no selected slot."""
    out = torch.zeros(q_latent.shape, dtype=torch.float32)
    for t in range(q_latent.shape[0]):
        slots = slot_indices[t].cpu()
        slots = slots[slots >= 0].long()
        if slots.numel() == 0:
            continue
        latent, rope = mla_codec.decode_rows(cache_rows.cpu()[slots], scales)
        q = torch.cat((q_latent[t], q_rope[t]), dim=-1).cpu()  # [H, 576]
        k = torch.cat((latent, rope), dim=-1).unsqueeze(1)  # [n, 1, 576]: one latent head shared by all
        out[t], _ = attend(q, k, latent.unsqueeze(1), sm_scale)
    return out


def positions_to_slots(positions: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Token positions of one request (< 0 = empty) -> cache slot ids (block * block_size + offset)."""
    blocks = block_table[positions.clamp(min=0).long() // block_size]
    slots = blocks.long() * block_size + positions.long() % block_size
    return torch.where(positions >= 0, slots, -1).to(torch.int32)
