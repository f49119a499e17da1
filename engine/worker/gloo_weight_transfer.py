"""vLLM's weight-transfer engine for backend "gloo": a trainer's weights, broadcast to CPU workers (engine/gloo_weights.py).

vLLM drives it as it drives its own engines: its worker's `init_weight_transfer_engine`, `start_weight_update`,
`update_weights`, `finish_weight_update` RPCs (reached through Dynamo's `init_weights_update_group` and
`update_weights_from_distributed` routes, engine/supervisor/worker_control.py). The stack starts CPU workers with
`--weight-transfer-config '{"backend": "gloo"}'`, and `register` (run before vLLM builds its worker) makes the
name known to vLLM's factory.

- update: each bucket, as it arrives, goes through the model's own `load_weights` (checkpoint names, so the
  model's own fusing of q/k/v and gate/up applies).
- finish: on CPU, every linear layer's packed form is rebuilt from the new weights (engine/worker/cpu_weight_reload.py
  keeps them unpacked for that).
"""

from __future__ import annotations

import logging
import time

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

from engine import gloo_weights
from engine.gloo_weights import GlooInitInfo, GlooUpdateInfo

log = logging.getLogger("rollout_serve.worker")


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if gloo_weights.BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(gloo_weights.BACKEND, __name__, "GlooWeightTransferEngine")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = None
        self.info: GlooInitInfo | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        rank = init_info.rank_offset + parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.group = gloo_weights.join(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                       init_info.timeout_s)
        self.info = init_info
        log.info("weight transfer: joined the trainer's gloo group as rank %d of %d", rank, init_info.world_size)

    def start_weight_update(self) -> None:
        if self.group is None:
            raise RuntimeError("no trainer connected: init_weight_transfer_engine first")

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    @torch.inference_mode()
    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None or self.info is None:
            raise RuntimeError("no trainer connected: init_weight_transfer_engine first")
        started = time.monotonic()
        for bucket in gloo_weights.receive(self.group, update_info, self.info.bucket_bytes):
            self.model.load_weights(bucket)
        log.info("weight transfer: %d tensors (%.1f MB) received and loaded in %.3f s", len(update_info.names),
                 update_info.total_bytes() / 1e6, time.monotonic() - started)

    def finish_weight_update(self) -> None:
        if self.device.type == "cpu":
            from engine.worker.cpu_weight_reload import repack  # imported on CPU workers only: it patches vLLM

            repack(self.model)

    def shutdown(self) -> None:
        self.group, self.info = None, None
