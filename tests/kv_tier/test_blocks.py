"""One tier object per block: pack (BLHNC) + encode, decode + unpack, on vLLM 0.32's per-layer cache views."""

import pytest
import torch

from engine.kv_tier.blocks import BlockCodec, kernel_view
from engine.kv_tier.formats import object_bytes
from kernels import nvfp4, page_codec

LAYERS, BLOCKS, HEADS, BS, HEAD_DIM = 4, 12, 2, 32, 64


def caches(dtype=torch.float32, seed=0, random_bits=False) -> list[torch.Tensor]:
    """Per-layer caches as vLLM 0.32 hands them to a connector: [num_blocks, heads, tokens, 2 * head_dim]."""
    g = torch.Generator().manual_seed(seed)
    shape = (BLOCKS, HEADS, BS, 2 * HEAD_DIM)
    if random_bits:  # every bit pattern, NaNs and infinities included
        int_type = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
        info = torch.iinfo(int_type)
        return [torch.randint(info.min, info.max, shape, generator=g, dtype=int_type).view(dtype) for _ in range(LAYERS)]
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(LAYERS)]


def copy_blocks(codec, src, dst, block_ids, dst_ids=None):
    objects = codec.read_blocks([kernel_view(c) for c in src], block_ids)
    codec.write_blocks(objects, [kernel_view(c) for c in dst], dst_ids or block_ids)
    return objects


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lossless_round_trip_is_bit_exact_and_touches_only_its_blocks(dtype):
    src, dst = caches(dtype, random_bits=True), caches(dtype, seed=1)
    before = [c.clone() for c in dst]
    codec = BlockCodec.for_caches(src, nvfp4=False)
    objects = copy_blocks(codec, src, dst, [7, 2, 3], [0, 5, 9])
    assert objects.dtype == torch.uint8 and tuple(objects.shape) == (3, codec.object_bytes)
    as_bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    for s, d, b in zip(src, dst, before):
        assert torch.equal(d[[0, 5, 9]].view(as_bits), s[[7, 2, 3]].view(as_bits))
        untouched = [i for i in range(BLOCKS) if i not in (0, 5, 9)]
        assert torch.equal(d[untouched].view(as_bits), b[untouched].view(as_bits))


def test_one_object_holds_a_block_of_every_layer_contiguously():
    src = caches()
    codec = BlockCodec.for_caches(src, nvfp4=False)
    objects = codec.read_blocks([kernel_view(c) for c in src], [4])
    block = objects.view(torch.float32).reshape(LAYERS, 2, HEADS, BS, HEAD_DIM)  # BLHNC with K/V halves
    for layer, cache in enumerate(src):
        assert torch.equal(block[layer, 0], cache[4, :, :, :HEAD_DIM])
        assert torch.equal(block[layer, 1], cache[4, :, :, HEAD_DIM:])


@pytest.mark.parametrize("nvfp4_blocks", [False, True])
def test_object_size_matches_the_capacity_formula(nvfp4_blocks):
    codec = BlockCodec.for_caches(caches(), nvfp4=nvfp4_blocks)
    objects = codec.read_blocks([kernel_view(c) for c in caches()], [0, 1])
    assert objects.shape[1] == codec.object_bytes == object_bytes(codec.shape, BS, codec.kv_format)


def test_nvfp4_objects_decode_exactly_as_the_kernels_reference_codec():
    src, dst = caches(), caches(seed=1)
    codec = BlockCodec.for_caches(src, nvfp4=True)
    ids = [1, 6, 8]
    copy_blocks(codec, src, dst, ids)
    for cache, out in zip(src, dst):
        halves = cache[ids].view(3, HEADS, BS, 2, HEAD_DIM)
        expected = torch.empty_like(halves)
        for half in range(2):  # one scale per half of a layer's content (K, V) and batch
            scale = nvfp4.global_scale_for(halves[..., half, :])
            expected[..., half, :] = page_codec.decode_heads(page_codec.encode_heads(halves[..., half, :], scale), scale)
        assert torch.equal(out[ids], expected.view(3, HEADS, BS, 2 * HEAD_DIM))
        assert (out[ids] - cache[ids]).norm() / cache[ids].norm() < 0.12  # E2M1 has 3 bits of magnitude


def test_nvfp4_objects_saved_in_different_batches_load_together():
    src = caches()
    src[0][5] *= 100  # block 5's layer 0 needs another global scale than block 2's
    codec = BlockCodec.for_caches(src, nvfp4=True)
    views = [kernel_view(c) for c in src]
    first, second = codec.read_blocks(views, [2]), codec.read_blocks(views, [5])
    together, separate = caches(seed=1), caches(seed=1)
    codec.write_blocks(torch.cat((first, second)), [kernel_view(c) for c in together], [2, 5])
    codec.write_blocks(first, [kernel_view(c) for c in separate], [2])
    codec.write_blocks(second, [kernel_view(c) for c in separate], [5])
    for a, b in zip(together, separate):
        assert torch.equal(a, b)


def test_bad_caches_and_objects_are_rejected():
    with pytest.raises(ValueError, match="2 \\* head_dim"):
        kernel_view(torch.zeros(4, 2, 32, 63))
    with pytest.raises(ValueError, match="multiple of 16"):
        BlockCodec.for_caches([torch.zeros(4, 2, 32, 80)], nvfp4=True)  # head_dim 40
    with pytest.raises(ValueError, match="carry its global scale"):
        BlockCodec.for_caches([torch.zeros(4, 1, 4, 32)], nvfp4=True)  # 1 head x 4 tokens x 1 scale: 4 sign bits
    codec = BlockCodec.for_caches(caches(), nvfp4=True)
    with pytest.raises(ValueError, match="objects must be uint8"):
        codec.decode(torch.zeros(1, codec.object_bytes - 1, dtype=torch.uint8))
