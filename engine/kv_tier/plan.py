"""Scheduler side of the KV tier connector: which blocks to load from the tier, which to save.

  lookup  (get_num_new_matched_tokens): the prompt's full blocks past the worker's own prefix-cache
          hit are looked up in the tier; the leading run that is there is loaded (at most up to
          the prompt's last token, which vLLM always computes).
  load    (update_state_after_alloc): once vLLM has given those tokens blocks, the load is planned.
  save    (request_finished): the request's full computed blocks (prompt and output) that the tier
          lacks are saved; vLLM keeps them allocated until the worker reports the save done.

A request is saved only under the weights it was admitted with (the full weights' policy version and
its adapter's, engine/kv_tier/policy.py), and only if those are still current (weights updated
mid-request: its KV is mixed, not saved).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from engine.kv_tier.keys import KeyScheme
from engine.kv_tier.policy import VersionFile, Weights
from engine.kv_tier.store import TierStore


@dataclass
class BlockTransfer:
    """Blocks of one request to move between vLLM's cache and the tier: block_ids[i] <-> keys[i]."""

    request_id: str
    block_ids: list[int]
    keys: list[str]


@dataclass
class TierMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass
class _Lookup:
    keys: list[str]  # keys of the prompt's loadable blocks, from block 0
    first_block: int  # first block the worker's own cache does not hold
    hit_blocks: int  # blocks from first_block on that the tier holds


class TierPlanner:
    def __init__(self, store: TierStore, block_size: int, version: VersionFile,
                 scheme_for: Callable[[object, Weights], KeyScheme], exists_key: Callable[[str], str] = lambda k: k,
                 on_stored: Callable[[object, int], None] | None = None):
        self.store = store
        self.block_size = block_size
        self.version = version
        self.scheme_for = scheme_for  # (request, the weights it runs on) -> KeyScheme
        self.exists_key = exists_key  # the key a lookup checks (tensor-parallel rank 0's)
        self.on_stored = on_stored    # (request, full blocks): they are in the tier (engine/kv_tier/events.py)
        self._admitted: dict[str, Weights] = {}
        self._lookups: dict[str, _Lookup] = {}
        self._pending = TierMetadata()

    def match(self, request, num_computed_tokens: int) -> int:
        """Tokens beyond `num_computed_tokens` (block-aligned) that can be loaded from the tier."""
        weights = self._admitted.setdefault(request.request_id, self._weights(request))
        loadable_blocks = (request.num_tokens - 1) // self.block_size
        first = num_computed_tokens // self.block_size
        if loadable_blocks <= first or weights != self._weights(request):
            return 0
        tokens = list(request.all_token_ids[: loadable_blocks * self.block_size])
        keys = self.scheme_for(request, weights).block_keys(tokens)
        hits = self.store.leading_hits([self.exists_key(k) for k in keys[first:]])
        self._lookups[request.request_id] = _Lookup(keys, first, hits)
        return hits * self.block_size

    def allocated(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        lookup = self._lookups.pop(request.request_id, None)
        if num_external_tokens <= 0 or lookup is None:
            return
        count = num_external_tokens // self.block_size
        if count > lookup.hit_blocks:
            raise ValueError(f"vLLM asked to load {count} blocks of request {request.request_id}, "
                             f"the tier offered {lookup.hit_blocks}")
        span = slice(lookup.first_block, lookup.first_block + count)
        self._pending.loads.append(BlockTransfer(request.request_id, list(block_ids[span]), lookup.keys[span]))

    def finished(self, request, block_ids: list[int]) -> bool:
        """Plans the save of the request's full blocks the tier lacks; True: keep its blocks until saved."""
        self._lookups.pop(request.request_id, None)
        weights = self._admitted.pop(request.request_id, None)
        if weights is None or weights != self._weights(request):
            return False
        full_blocks = min(len(block_ids), request.num_computed_tokens // self.block_size)
        if full_blocks == 0:
            return False
        keys = self.scheme_for(request, weights).block_keys(list(request.all_token_ids[: full_blocks * self.block_size]))
        present = self.store.exists([self.exists_key(k) for k in keys])
        missing = [i for i, there in enumerate(present) if there is False]
        if self.on_stored and all(there is not None for there in present):
            self.on_stored(request, full_blocks)  # there already, or saved now
        if not missing:
            return False
        self._pending.saves.append(BlockTransfer(request.request_id, [block_ids[i] for i in missing],
                                                 [keys[i] for i in missing]))
        return True

    def _weights(self, request) -> Weights:
        return self.version.weights_of(lora_name(request))

    def take_metadata(self) -> TierMetadata:
        metadata, self._pending = self._pending, TierMetadata()
        return metadata


def lora_name(request) -> str:
    """The LoRA adapter a vLLM request runs with ("" for none)."""
    return request.lora_request.lora_name if getattr(request, "lora_request", None) else ""
