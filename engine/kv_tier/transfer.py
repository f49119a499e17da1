"""Worker side of the KV tier connector: moves planned blocks between vLLM's caches and the tier.

Loads run before the forward pass that needs them (vLLM schedules the request with those tokens
already computed); saves run after the step's forward, for blocks vLLM keeps allocated until
`finished_saves` reports them. Both are synchronous: one batched store call per request.
"""

from __future__ import annotations

import logging
import time

import torch

from engine.kv_tier.blocks import BlockCodec, kernel_view
from engine.kv_tier.keys import rank_key
from engine.kv_tier.plan import BlockTransfer
from engine.kv_tier.store import TierStore

log = logging.getLogger(__name__)


class BlockMover:
    def __init__(self, store: TierStore, nvfp4: bool, tp_rank: int = 0, tp_size: int = 1):
        self.store = store
        self.nvfp4 = nvfp4
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.views: list[torch.Tensor] = []
        self.codec: BlockCodec | None = None
        self._saved_requests: set[str] = set()
        self._failed_blocks: set[int] = set()

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        caches = list(kv_caches.values())
        self.views = [kernel_view(cache) for cache in caches]
        self.codec = BlockCodec.for_caches(caches, self.nvfp4)
        log.info("KV tier: %d layers of %s caches %s, %s objects of %d bytes per %d-token block",
                 len(caches), caches[0].dtype, tuple(caches[0].shape), self.codec.kv_format,
                 self.codec.object_bytes, self.codec.block_size)
        self.store.staging()  # connect and register the staging buffer now, not on the first request

    def load(self, transfer: BlockTransfer) -> None:
        started = time.perf_counter()
        objects = torch.empty((len(transfer.keys), self.codec.object_bytes), dtype=torch.uint8)
        arrived = self.store.get(self._keys(transfer), objects)
        good = [i for i, ok in enumerate(arrived) if ok]
        self._failed_blocks.update(b for b, ok in zip(transfer.block_ids, arrived) if not ok)
        if good:
            self.codec.write_blocks(objects[good], self.views, [transfer.block_ids[i] for i in good])
        log.info("KV tier: loaded %d/%d blocks of request %s in %.1f ms", len(good), len(arrived),
                 transfer.request_id, 1e3 * (time.perf_counter() - started))

    def save(self, transfer: BlockTransfer) -> None:
        started = time.perf_counter()
        try:
            objects = self.codec.read_blocks(self.views, transfer.block_ids)
            stored = self.store.put(self._keys(transfer), objects)
        except (ValueError, RuntimeError) as exc:  # e.g. non-finite KV values cannot be NVFP4-encoded
            log.warning("KV tier: request %s not saved: %s", transfer.request_id, exc)
            stored = 0
        self._saved_requests.add(transfer.request_id)  # done either way: a failed save is a later miss
        log.info("KV tier: saved %d/%d blocks of request %s in %.1f ms", stored, len(transfer.keys),
                 transfer.request_id, 1e3 * (time.perf_counter() - started))

    def finished_saves(self) -> set[str]:
        done, self._saved_requests = self._saved_requests, set()
        return done

    def failed_blocks(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def _keys(self, transfer: BlockTransfer) -> list[str]:
        return [rank_key(key, self.tp_rank, self.tp_size) for key in transfer.keys]
