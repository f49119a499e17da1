"""One tier object per KV block: vLLM's per-layer caches <-> block-major (BLHNC) objects.

vLLM 0.32 hands a connector one [num_blocks, heads, tokens, content] view per layer, content
being K and V of one head (2 * head_dim). `kernel_view` presents each as the
[num_blocks, 2, tokens, heads, head_dim] cache that kernels.layouts packs, so
`kernels.layouts.pack_blhnc` gathers a block of every layer into one contiguous
[layers, 2, heads, tokens, head_dim] region (one object, one transfer) and `unpack_blhnc` writes it
back bit-exactly. (Backends differ in what the two halves of `content` mean: K|V per token on
GPU, whole K then V pages on CPU. The view is a bijection on the block's bytes either way, and
each head_dim-long run is one K or V vector, which is all NVFP4 needs.)

Object bytes:
  lossless: the packed block in the cache dtype;
  nvfp4:    the packed block with every head_dim vector NVFP4-encoded by kernels.page_codec (head_dim/2 code
            bytes + head_dim/16 E4M3 scales), and 2 FP32 global scales per layer carried in sign bits: E4M3
            block scales are never negative, so the sign bits of the first 32 scale bytes of each half of a
            layer hold that half's global scale, bit i in the i-th byte. No header, then: an object is a size
            Mooncake's allocator reuses as is (engine/kv_tier/formats.py slot_bytes; 18,432 bytes for the tiny
            model, where a 32-byte header cost a 20,480-byte slot).
A global scale is NVIDIA's 448 * 6 / amax over one half of a layer's content (K, then V, where the backend
keeps them so) in the batch of blocks being saved (a block is written once, so its amax is known: no
calibration needed). One scale per half, as the kernels calibrate K and V apart: keys are often far larger than
values, and one scale for both leaves the values' E4M3 block scales too little range (measured on the tiny
model, tests/kv_tier/test_nvfp4_accuracy.py: attention error 0.162 with one scale per layer, 0.156 with one
per half, the kernels' NVFP4 of the same BF16 values 0.156).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_tier.formats import KvShape, object_bytes
from kernels import layouts, nvfp4, page_codec

SCALE_BITS = 32  # an FP32 global scale, one bit per block-scale byte
SIGN = 0x80


def kernel_view(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, heads, tokens, 2 * head_dim] -> a [num_blocks, 2, tokens, heads, head_dim] view."""
    if cache.ndim != 4 or cache.shape[-1] % 2:
        raise ValueError(f"KV tier needs per-layer caches [num_blocks, heads, tokens, 2 * head_dim], "
                         f"got {tuple(cache.shape)}")
    blocks, heads, tokens, content = cache.shape
    return cache.view(blocks, heads, tokens, 2, content // 2).permute(0, 3, 2, 1, 4)


@dataclass(frozen=True)
class BlockCodec:
    shape: KvShape
    block_size: int
    dtype: torch.dtype
    nvfp4: bool

    @classmethod
    def for_caches(cls, layer_caches: list[torch.Tensor], nvfp4: bool) -> BlockCodec:
        _, heads, tokens, content = layer_caches[0].shape
        codec = cls(KvShape(len(layer_caches), heads, content // 2), tokens, layer_caches[0].dtype, nvfp4)
        if nvfp4:
            scale_bytes = page_codec.row_bytes(codec.shape.head_dim) - codec.shape.head_dim // 2  # raises unless
            if heads * tokens * scale_bytes < SCALE_BITS:  # head_dim is a multiple of 16
                raise ValueError(f"NVFP4 tier objects need {SCALE_BITS} block scales per half of a layer to carry its "
                                 f"global scale; a block of {heads} heads x {tokens} tokens has fewer")
        return codec

    @property
    def kv_format(self) -> str:
        return "nvfp4" if self.nvfp4 else str(self.dtype).removeprefix("torch.")

    @property
    def object_bytes(self) -> int:
        return object_bytes(self.shape, self.block_size, self.kv_format)

    @property
    def packed_shape(self) -> tuple[int, ...]:
        s = self.shape
        return (s.num_layers, 2, s.num_kv_heads, self.block_size, s.head_dim)

    # ---- caches <-> objects -----------------------------------------------------------------

    def read_blocks(self, views: list[torch.Tensor], block_ids: list[int]) -> torch.Tensor:
        """Blocks of the caches (kernel views) -> uint8 objects [n, object_bytes] on the CPU."""
        packed = layouts.pack_blhnc(views, block_ids)  # [n, layers, 2, heads, tokens, head_dim]
        return self.encode(packed)

    def write_blocks(self, objects: torch.Tensor, views: list[torch.Tensor], block_ids: list[int]) -> None:
        packed = self.decode(objects).to(views[0].device)
        layouts.unpack_blhnc(packed, views, block_ids)

    # ---- packed blocks <-> objects -----------------------------------------------------------

    def encode(self, packed: torch.Tensor) -> torch.Tensor:
        """[n, layers, 2, heads, tokens, head_dim] in the cache dtype -> uint8 [n, object_bytes]."""
        n = packed.shape[0]
        if not self.nvfp4:
            return packed.contiguous().view(torch.uint8).reshape(n, -1).cpu()
        halves = [(layer, half) for layer in range(self.shape.num_layers) for half in range(2)]
        scales = [nvfp4.global_scale_for(packed[:, layer, half]) for layer, half in halves]
        rows = torch.stack([page_codec.encode_heads(packed[:, layer, half], scale)
                            for (layer, half), scale in zip(halves, scales)], dim=1)  # [n, layers * 2, heads, ...]
        carriers = self._carriers()
        if (rows[carriers] & SIGN).any():
            raise ValueError("an E4M3 block scale is negative: its sign bit cannot carry a global scale")
        bits = torch.tensor(scales, dtype=torch.float32).view(torch.int32).unsqueeze(-1) >> torch.arange(SCALE_BITS)
        rows[carriers] |= ((bits & 1).to(torch.uint8) << 7).to(rows.device)  # [layers * 2, 32], every object
        return rows.reshape(n, -1).cpu()

    def decode(self, objects: torch.Tensor) -> torch.Tensor:
        """uint8 [n, object_bytes] -> [n, layers, 2, heads, tokens, head_dim] in the cache dtype."""
        n = objects.shape[0]
        if objects.dtype != torch.uint8 or tuple(objects.shape[1:]) != (self.object_bytes,):
            raise ValueError(f"objects must be uint8 [n, {self.object_bytes}], got {objects.dtype} {tuple(objects.shape)}")
        if not self.nvfp4:
            return objects.contiguous().view(self.dtype).reshape(n, *self.packed_shape)
        rows = objects.reshape(n, self.shape.num_layers * 2, self.shape.num_kv_heads, self.block_size, -1).clone()
        carriers = self._carriers()
        bits = (rows[carriers] >> 7).to(torch.int64)  # [n, layers * 2, 32]
        scales = (bits << torch.arange(SCALE_BITS)).sum(-1).to(torch.int32).view(torch.float32)  # [n, layers * 2]
        rows[carriers] &= ~SIGN & 0xFF
        out = torch.empty((n, self.shape.num_layers * 2, *self.packed_shape[2:]), dtype=self.dtype)
        # Blocks saved together share their scales: decode each group of equal scales at once.
        groups, group_of = torch.unique(scales, dim=0, return_inverse=True)
        for g, group_scales in enumerate(groups):
            members = (group_of == g).nonzero().flatten()
            for half, scale in enumerate(group_scales.tolist()):
                out[members, half] = page_codec.decode_heads(rows[members, half], scale, self.dtype)
        return out.view(n, *self.packed_shape)

    def _carriers(self) -> tuple:
        """Index of the first SCALE_BITS block-scale bytes of every half of a layer in rows [n, layers * 2, heads,
        tokens, row bytes]: in (head, token, scale) order, the scales following each vector's code bytes."""
        per_vector = self.shape.head_dim // nvfp4.BLOCK_SIZE
        i = torch.arange(SCALE_BITS)
        return (slice(None), slice(None), i // (self.block_size * per_vector), (i // per_vector) % self.block_size,
                self.shape.head_dim // 2 + i % per_vector)
