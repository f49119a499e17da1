"""engine/worker/block_major_kv.py: which KV caches are handed to NIXL as rows, on caches laid out the way
vLLM lays them out (vllm.v1.kv_cache_interface.create_kv_cache_views over one flat int8 buffer)."""

import torch

from engine.worker.block_major_kv import block_rows

LAYERS, BLOCKS, HEADS, TOKENS, CONTENT = 4, 6, 2, 32, 128  # CONTENT: K and V of one head, bf16


def layer_views(block_major: bool) -> dict[str, torch.Tensor]:
    page = HEADS * TOKENS * CONTENT
    flat = torch.arange(LAYERS * BLOCKS * page, dtype=torch.float32).to(torch.bfloat16)
    views = {}
    for layer in range(LAYERS):
        if block_major:  # [B, L, H, N, C]: block b of every layer is one row
            view = flat.as_strided((BLOCKS, HEADS, TOKENS, CONTENT), (LAYERS * page, TOKENS * CONTENT, CONTENT, 1),
                                   layer * page)
        else:  # [L, B, H, N, C]: vLLM's default
            view = flat[layer * BLOCKS * page:(layer + 1) * BLOCKS * page].view(BLOCKS, HEADS, TOKENS, CONTENT)
        views[f"model.layers.{layer}.self_attn.attn"] = view
    return views


def test_a_block_major_cache_is_registered_as_rows_holding_every_layer_of_a_block():
    views = layer_views(block_major=True)
    rows = block_rows(views)
    assert rows is not None and rows.dtype == torch.uint8
    assert tuple(rows.shape) == (BLOCKS, LAYERS * HEADS * TOKENS * CONTENT * 2)
    # Row b holds block b of layer 0, then of layer 1, ...: the bytes NIXL moves in one descriptor.
    for b in (0, 3, BLOCKS - 1):
        expected = torch.cat([view[b].reshape(-1).view(torch.uint8) for view in views.values()])
        assert torch.equal(rows[b], expected)


def test_a_layer_major_cache_keeps_vllms_per_layer_regions():
    assert block_rows(layer_views(block_major=False)) is None


def test_layers_in_separate_allocations_keep_vllms_per_layer_regions():
    views = {name: view.clone() for name, view in layer_views(block_major=True).items()}
    assert block_rows(views) is None
