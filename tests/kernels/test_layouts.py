"""Layer-major <-> BLHNC packing (bit-exact) and transfer-descriptor counts."""

import pytest
import torch

from kernels import layouts


def random_bit_caches(layers=3, num_blocks=10, block_size=4, heads=2, content=8, dtype=torch.bfloat16):
    """Per-layer caches filled with random bit patterns (NaN payloads and -0 included)."""
    torch.manual_seed(0)
    return [
        torch.randint(-(2**15), 2**15, (num_blocks, 2, block_size, heads, content), dtype=torch.int16).view(dtype)
        for _ in range(layers)
    ]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_pack_puts_block_then_layer_then_kv_head_token_content():
    caches = random_bit_caches()
    block_ids = [7, 2, 3]
    buffer = layouts.pack_blhnc(caches, block_ids)
    assert buffer.shape == (3, 3, 2, 2, 4, 8) and buffer.is_contiguous()
    for i, block in enumerate(block_ids):
        for layer, cache in enumerate(caches):
            for kv in range(2):
                for head in range(2):
                    assert torch.equal(bits(buffer[i, layer, kv, head]), bits(cache[block, kv, :, head]))


def test_unpack_restores_exactly_the_packed_blocks_bit_for_bit():
    caches = random_bit_caches()
    block_ids = [9, 0, 1, 2, 5]
    buffer = layouts.pack_blhnc(caches, block_ids)
    restored = [torch.zeros_like(c) for c in caches]
    layouts.unpack_blhnc(buffer, restored, block_ids)
    others = [b for b in range(10) if b not in block_ids]
    for cache, back in zip(caches, restored):
        assert torch.equal(bits(back[block_ids]), bits(cache[block_ids]))
        assert not bits(back[others]).any()


def test_uint8_nvfp4_pages_pack_too():
    caches = [torch.randint(0, 256, (6, 2, 32, 2, 36), dtype=torch.uint8) for _ in range(4)]
    buffer = layouts.pack_blhnc(caches, [1, 4])
    restored = [c.clone() for c in caches]
    for c in restored:
        c[[1, 4]] = 0
    layouts.unpack_blhnc(buffer, restored, [1, 4])
    assert all(torch.equal(a, b) for a, b in zip(caches, restored))


def test_block_runs_merge_ids_that_follow_each_other():
    assert layouts.block_runs([]) == []
    assert layouts.block_runs([4, 5, 6, 10, 11, 3, 7]) == [(4, 3), (10, 2), (3, 1), (7, 1)]


def test_descriptor_counts_layer_major_vs_blhnc():
    block_ids = [4, 5, 6, 10, 11, 3]  # three runs
    assert len(layouts.layer_major_regions(61, 100, block_ids)) == 61 * 3
    assert len(layouts.blhnc_regions(6100, block_ids)) == 3
    assert layouts.blhnc_regions(6100, block_ids)[1] == layouts.Region(0, 10 * 6100, 2 * 6100)
    assert layouts.layer_major_regions(2, 100, block_ids)[4] == layouts.Region(1, 10 * 100, 200)


def test_regions_cover_exactly_the_request_bytes():
    caches = random_bit_caches(layers=2)
    block_ids = [3, 4, 8]
    block_bytes = caches[0][0].numel() * 2
    raw = [c.view(torch.uint8).flatten() for c in caches]
    gathered = torch.cat([raw[r.buffer_index][r.offset : r.offset + r.length] for r in layouts.layer_major_regions(2, block_bytes, block_ids)])
    expected = torch.cat([c[block_ids].view(torch.uint8).flatten() for c in caches])
    assert torch.equal(gathered, expected)

    pool = layouts.pack_blhnc(caches, list(range(10))).view(torch.uint8).flatten()  # a BLHNC pool of all blocks
    pool_block_bytes = pool.numel() // 10
    gathered = torch.cat([pool[r.offset : r.offset + r.length] for r in layouts.blhnc_regions(pool_block_bytes, block_ids)])
    assert torch.equal(gathered, layouts.pack_blhnc(caches, block_ids).view(torch.uint8).flatten())


def test_layouts_reject_bad_input():
    caches = random_bit_caches()
    with pytest.raises(ValueError, match="out of range"):
        layouts.pack_blhnc(caches, [1, 10])
    with pytest.raises(ValueError, match="unique"):
        layouts.pack_blhnc(caches, [1, 1])
    with pytest.raises(ValueError, match="all layers must match"):
        layouts.pack_blhnc([caches[0], caches[1][:5]], [1])
    with pytest.raises(ValueError, match="num_blocks, 2"):
        layouts.pack_blhnc([torch.zeros(4, 16, 576)], [0])
    with pytest.raises(ValueError, match="BLHNC buffer must be"):
        layouts.unpack_blhnc(torch.zeros(1, 3, 2, 2, 4, 8), caches, [0])
