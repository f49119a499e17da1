"""What the tier holds, told to Dynamo's KV router: KV events with medium "CPU".

vLLM publishes the KV events a connector returns from `take_events()` through the worker's own ZMQ
publisher, beside the device cache's events. Dynamo's router keeps a second, host-tier index per
worker for events whose medium is "CPU" and scores a worker's host-tier prefix overlap with
`--router-host-cache-hit-weight` after its device overlap. So a prefix evicted from a worker's cache
but kept in the tier still counts as (partly) cached there, and its session stays put.

A request's full blocks are announced with vLLM's own block hashes (the ones its device events use),
so the router chains them like device blocks. When the policy version changes, every announced block
is withdrawn (BlockRemoved, medium "CPU"): KV of the old weights is never loaded again.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, maybe_convert_block_hash, to_event_extra_keys

from engine.kv_tier.policy import VersionFile

MEDIUM_TIER = "CPU"  # Dynamo matches this spelling exactly (vLLM's own offloading connectors send "cpu")


class TierEvents:
    def __init__(self, block_size: int, version: VersionFile, max_announced: int = 1 << 20):
        self.block_size = block_size
        self.version = version
        self.max_announced = max_announced
        self._announced: OrderedDict = OrderedDict()  # block hash -> None, oldest first
        self._announced_version = version.current()
        self._pending: list[KVCacheEvent] = []

    def stored(self, request, full_blocks: int) -> None:
        """The request's first `full_blocks` blocks are in the tier (saved now, or earlier by any worker)."""
        hashes = [maybe_convert_block_hash(h) for h in request.block_hashes[:full_blocks]]
        if not hashes or all(h in self._announced for h in hashes):
            return
        end = full_blocks * self.block_size
        extra_keys = [generate_block_hash_extra_keys(request, start, start + self.block_size, 0)[0]
                      for start in range(0, end, self.block_size)]
        lora = request.lora_request
        self._pending.append(BlockStored(
            block_hashes=hashes, parent_block_hash=None, token_ids=list(request.all_token_ids[:end]),
            block_size=self.block_size, lora_id=lora.adapter_id if lora else None, medium=MEDIUM_TIER,
            lora_name=lora.name if lora else None, extra_keys=to_event_extra_keys(extra_keys), group_idx=0))
        for h in hashes:
            self._announced[h] = None
            self._announced.move_to_end(h)
        while len(self._announced) > self.max_announced:  # forget the oldest: at worst a stale credit
            self._announced.popitem(last=False)

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call; all announced blocks withdrawn if the policy version moved."""
        current = self.version.current()
        if current != self._announced_version:
            self._pending = [e for e in self._pending if not isinstance(e, BlockStored)]
            if self._announced:
                self._pending.append(BlockRemoved(block_hashes=list(self._announced), medium=MEDIUM_TIER))
            self._announced.clear()
            self._announced_version = current
        events, self._pending = self._pending, []
        return events
