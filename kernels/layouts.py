"""KV cache layouts for transfer: vLLM's layer-major paged caches and block-major BLHNC buffers.

vLLM gives a KV connector one tensor per layer, [num_blocks, 2, block_size, heads, content]
("layer-major": one block's bytes are scattered over num_layers tensors). BLHNC puts Block
outermost, then Layer, Head, Token (N) and Content, so one block's data for every layer is
contiguous; K and V are kept together inside each layer, giving per-block shape
[layers, 2, heads, block_size, content].

A request's blocks are merged into runs of adjacent ids. Moving a request then needs
  layer-major: one contiguous region (transfer descriptor) per (layer, run),
  BLHNC:       one region per run (a BLHNC pool stores block b at b * bytes_per_block).
MLA caches ([num_blocks, block_size, row_bytes]) fit as [num_blocks, 1, block_size, 1, row_bytes].
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Region:
    """A contiguous byte range to transfer: `length` bytes at `offset` in buffer `buffer_index`."""

    buffer_index: int  # the layer for layer-major, 0 for a BLHNC pool
    offset: int
    length: int


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """Runs (first_id, count) of ids that follow each other (id, id + 1, ...) in the given order."""
    runs: list[tuple[int, int]] = []
    for block_id in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block_id, 1))
    return runs


def layer_major_regions(num_layers: int, bytes_per_block: int, block_ids: list[int]) -> list[Region]:
    """Regions for a request in per-layer caches; `bytes_per_block` is one block of one layer."""
    runs = block_runs(block_ids)
    return [
        Region(layer, first * bytes_per_block, count * bytes_per_block)
        for layer in range(num_layers)
        for first, count in runs
    ]


def blhnc_regions(bytes_per_block: int, block_ids: list[int]) -> list[Region]:
    """Regions for a request in a BLHNC pool; `bytes_per_block` is one block of all layers."""
    return [Region(0, first * bytes_per_block, count * bytes_per_block) for first, count in block_runs(block_ids)]


def pack_blhnc(layer_caches: list[torch.Tensor], block_ids: list[int]) -> torch.Tensor:
    """Blocks `block_ids` of the per-layer caches -> BLHNC buffer [n, layers, 2, heads, block_size, content]."""
    ids = _checked_ids(layer_caches, block_ids)
    per_layer = [cache[ids].permute(0, 1, 3, 2, 4) for cache in layer_caches]  # [n, 2, H, N, C] each
    return torch.stack(per_layer, dim=1).contiguous()


def unpack_blhnc(buffer: torch.Tensor, layer_caches: list[torch.Tensor], block_ids: list[int]) -> None:
    """Writes a BLHNC buffer (from pack_blhnc) back into blocks `block_ids` of the per-layer caches."""
    ids = _checked_ids(layer_caches, block_ids)
    num_blocks, _, block_size, heads, content = layer_caches[0].shape
    expected = (len(block_ids), len(layer_caches), 2, heads, block_size, content)
    if tuple(buffer.shape) != expected or buffer.dtype != layer_caches[0].dtype:
        raise ValueError(
            f"BLHNC buffer must be {layer_caches[0].dtype} {expected}, got {buffer.dtype} {tuple(buffer.shape)}"
        )
    for layer, cache in enumerate(layer_caches):
        cache[ids] = buffer[:, layer].permute(0, 1, 3, 2, 4)


def _checked_ids(layer_caches: list[torch.Tensor], block_ids: list[int]) -> torch.Tensor:
    if not layer_caches:
        raise ValueError("need at least one layer cache")
    first = layer_caches[0]
    if first.ndim != 5 or first.shape[1] != 2:
        raise ValueError(f"layer caches must be [num_blocks, 2, block_size, heads, content], got {tuple(first.shape)}")
    for layer, cache in enumerate(layer_caches):
        if cache.shape != first.shape or cache.dtype != first.dtype:
            raise ValueError(
                f"layer {layer} cache is {cache.dtype} {tuple(cache.shape)}, "
                f"layer 0 is {first.dtype} {tuple(first.shape)}: all layers must match"
            )
    if len(set(block_ids)) != len(block_ids):
        raise ValueError(f"block ids must be unique, got {list(block_ids)}")
    bad = [b for b in block_ids if not 0 <= b < first.shape[0]]
    if bad:
        raise ValueError(f"block ids {bad} are out of range for caches of {first.shape[0]} blocks")
    return torch.tensor(block_ids, dtype=torch.long, device=first.device)
