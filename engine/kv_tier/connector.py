"""KvTierConnector: vLLM's KV connector API over the Mooncake tier (engine/kv_tier/plan.py, transfer.py).

Register with
  --kv-transfer-config '{"kv_connector": "KvTierConnector", "kv_connector_module_path": "engine.kv_tier.connector",
                         "kv_role": "kv_both", "kv_connector_extra_config": {"master": "127.0.0.1:20580",
                         "model_id": "...", "nvfp4": true, "policy_version": 0, "policy_version_file": "..."}}'
(engine/kv_tier/config.py builds it). vLLM creates one instance in the scheduler (lookups, plans)
and one per worker (moves blocks); they share the process's store client when colocated.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from engine.kv_tier.config import TierConnectorConfig
from engine.kv_tier.events import TierEvents
from engine.kv_tier.keys import KeyScheme, rank_key
from engine.kv_tier.plan import TierMetadata, TierPlanner, lora_name
from engine.kv_tier.policy import VersionFile, Weights
from engine.kv_tier.store import shared_store
from engine.kv_tier.transfer import BlockMover
from engine.weight_stamps import user_salt


def _log_like_vllm() -> None:
    """engine.kv_tier.* loggers print through vLLM's handler, into the worker's log."""
    ours, vllm_logger = logging.getLogger("engine.kv_tier"), logging.getLogger("vllm")
    if not ours.handlers and vllm_logger.handlers:
        ours.handlers = list(vllm_logger.handlers)
        ours.setLevel(vllm_logger.level)
        ours.propagate = False


class KvTierConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        _log_like_vllm()
        self.config = TierConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config or {})
        self.block_size = vllm_config.cache_config.block_size
        store = shared_store(self.config.master)
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.planner: TierPlanner | None = None
        self.mover: BlockMover | None = None
        self.events: TierEvents | None = None
        if role == KVConnectorRole.SCHEDULER:
            version = VersionFile(self.config.version_path, self.config.policy_version)
            self.events = TierEvents(self.block_size, version) if self.config.announce else None
            self.planner = TierPlanner(store, self.block_size, version, self._key_scheme,
                                       exists_key=lambda key: rank_key(key, 0, tp_size),
                                       on_stored=self.events.stored if self.events else None)
            store.client()  # connect at engine start (fails loudly there), not on the first request
        else:
            from vllm.distributed import get_tensor_model_parallel_rank

            self.mover = BlockMover(store, self.config.nvfp4, get_tensor_model_parallel_rank(), tp_size)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a later miss

    def _key_scheme(self, request, weights: Weights) -> KeyScheme:
        cache = self._vllm_config.cache_config
        dtype = str(self._vllm_config.model_config.dtype).removeprefix("torch.")
        kv_format = "nvfp4" if self.config.nvfp4 else (dtype if cache.cache_dtype == "auto" else cache.cache_dtype)
        lora = lora_name(request)
        if lora and weights.adapter is not None:
            lora = f"{lora}@v{weights.adapter}"  # a new version of an adapter under the same name is other weights
        return KeyScheme(self.config.model_id, weights.base, kv_format, self.block_size, lora,
                         user_salt(request.cache_salt))

    # ---- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.planner.match(request, num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self.planner.allocated(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self.planner.take_metadata()

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.planner.finished(request, block_ids), None

    def take_events(self):
        return self.events.take() if self.events else ()

    # ---- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.mover.register(kv_caches)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, TierMetadata)
        for transfer in metadata.loads:
            self.mover.load(transfer)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loaded every layer already

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # whole blocks (all layers) are saved in wait_for_save

    def wait_for_save(self) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, TierMetadata)
        for transfer in metadata.saves:
            self.mover.save(transfer)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.mover.finished_saves() or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.mover.failed_blocks()
