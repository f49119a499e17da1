"""A vLLM general plugin: block-major (BLHNC) KV caches on prefill/decode workers, one NIXL descriptor per block.

The rule: in a block-major cache, block b of every layer is one contiguous row of memory, so moving a block of
all layers from a prefill worker to a decode worker is one NIXL descriptor (layer-major: one per layer).

vLLM 0.32 has the layouts (`vllm/v1/kv_cache_layout.py`, chosen by VLLM_KV_CACHE_LAYOUT) and views each
layer's cache as a strided slice of the shared rows. Two things stop it short of that rule on our workers:
  1. vLLM's CPU attention backend declares LBHNC only. Its kernels (`cpu_attn_reshape_and_cache`,
     `cpu_attention_with_kv_cache`) address a block through the view's block stride, and a BLHNC layer view
     keeps the head-major block interior they read (H, N, C contiguous); so we declare BLHNC as well.
     tests/disagg/test_block_major.py checks it: the same greedy tokens and logprobs either way.
  2. vLLM's NIXL worker registers whole rows only for MLA caches (a TODO there about slicing heads for
     heterogeneous tensor parallelism); an attention layer whose page is contiguous gets its own strided
     region, so a block still costs one descriptor per layer. With one tensor-parallel rank per worker no
     head is ever sliced, so we hand the NIXL worker the rows themselves: every layer's registration then
     resolves to the same whole-row region (vLLM's own branch for pages that are not contiguous), and a
     transfer is one descriptor per block.

Active only where the stack asks for it (worker environment ROLLOUT_SERVE_KV_LAYOUT=BLHNC, set with
VLLM_KV_CACHE_LAYOUT by engine/supervisor/disaggregation.py for prefill and decode workers). Both sides of a
transfer must use the same layout: vLLM's NIXL handshake refuses a mismatch.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)

SWITCH = "ROLLOUT_SERVE_KV_LAYOUT"
BLOCK_MAJOR = "BLHNC"


def register() -> None:
    if os.environ.get(SWITCH) != BLOCK_MAJOR:
        return
    _declare_cpu_attention_block_major()
    _register_rows_with_nixl()


def _declare_cpu_attention_block_major() -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.kv_cache_layout import KVCacheLayout

    if getattr(CPUAttentionBackend, "_rollout_serve_block_major", False):
        return  # plugins may load more than once per process
    declared = CPUAttentionBackend.supported_kv_cache_layouts()

    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (*declared, KVCacheLayout.BLHNC)

    CPUAttentionBackend.supported_kv_cache_layouts = classmethod(supported_kv_cache_layouts)
    CPUAttentionBackend._rollout_serve_block_major = True


def block_rows(kv_caches: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The rows of a block-major cache that every layer's view slices: a (blocks, row bytes) uint8 view of the
    shared storage. None when the layers do not share one storage in rows (a layer-major cache, or several
    allocations), so the caller keeps vLLM's per-layer regions."""
    caches = list(kv_caches.values())
    if not caches or any(cache.ndim < 2 for cache in caches):
        return None
    storage = caches[0].untyped_storage()
    row_bytes = caches[0].stride(0) * caches[0].element_size()
    blocks = caches[0].shape[0]
    for cache in caches:
        if (cache.untyped_storage().data_ptr() != storage.data_ptr()
                or cache.stride(0) * cache.element_size() != row_bytes or cache.shape[0] != blocks):
            return None
    if storage.nbytes() != blocks * row_bytes or row_bytes == caches[0][0].nbytes:
        return None  # not rows of several layers each
    return torch.empty(0, dtype=torch.uint8, device=caches[0].device).set_(storage, 0, (blocks, row_bytes),
                                                                           (row_bytes, 1))


def _register_rows_with_nixl() -> None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    except ImportError:
        return  # no NIXL in this install: nothing to register
    if getattr(NixlBaseConnectorWorker, "_rollout_serve_block_major", False):
        return
    register_layers = NixlBaseConnectorWorker.register_kv_caches

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        rows = None
        if not self.use_mla and not self._has_mamba and self.world_size == 1 and not self.use_host_buffer:
            rows = block_rows(kv_caches)
        if rows is None:
            return register_layers(self, kv_caches)
        register_layers(self, dict.fromkeys(kv_caches, rows))
        self.device_kv_caches = kv_caches  # what the rest of the worker reads per layer
        log.info("NIXL: %d layers registered as one block-major region (%d blocks of %d bytes): one descriptor "
                 "per block", len(kv_caches), rows.shape[0], rows.shape[1])

    NixlBaseConnectorWorker.register_kv_caches = register_kv_caches
    NixlBaseConnectorWorker._rollout_serve_block_major = True
