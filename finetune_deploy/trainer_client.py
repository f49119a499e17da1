"""The trainer's side of rollout-serve: the few lines a trainer needs (examples/async_rl.py uses each).

    from finetune_deploy.trainer_client import WeightPusher, attach_rewards, export_rl_dataset

    pusher = WeightPusher.connect("http://127.0.0.1:8000", policy, api_key=ADMIN_KEY)  # once
    ...                                          # every step:
    attach_rewards(url, [{"request_id": rid, "reward": r}, ...], api_key=KEY)   # to the served traces
    pusher.push(version=step)   # rollouts in flight go on under the new weights (in_flight keep)
    ...                                          # at the end (where the server's state directory is):
    dataset = export_rl_dataset(state_dir / "traces", out_dir)   # a Hugging Face dataset, one row per rollout

Pushed weights are vLLM's trainer-side weight-transfer flow (the server's side: finetune_deploy/weight_transfer.py): `GlooTrainerWeightTransferEngine` is a vLLM
`TrainerWeightTransferEngine` for backend "gloo" (the CPU path; vLLM's own engines need CUDA), and `PoolWeightSync`
is a vLLM `VLLMWeightSyncClient` over the pool's routes (rollout_server/routes/weight_transfer.py). The trainer is
rank 0 of the group and hosts its rendezvous on `master_address` (an address the workers reach).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import torch
from vllm.distributed.weight_transfer.base import (
    ModuleSource,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
)

from engine import gloo_weights
from engine.gloo_weights import GlooUpdateInfo


class PoolWeightSync:
    """vLLM's `VLLMWeightSyncClient` protocol over a rollout-serve pool's weight-transfer routes (admin key)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 in_flight: str = "keep", running_kv: str | None = None):
        self.url = f"{base_url.rstrip('/')}/v1/rl/weight_transfer"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.in_flight, self.running_kv = in_flight, running_kv  # what a round does with requests running
        self.last_round: dict = {}  # the server's account of the last finished round (pauses_s, status, ...)

    def world_size(self) -> int:
        """The pool's receiving ranks."""
        response = httpx.get(f"{self.url}/get_world_size", headers=self.headers, timeout=self.timeout_s)
        return _checked(response)["world_size"]

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        body = {"in_flight": self.in_flight}
        if self.running_kv is not None:
            body["running_kv"] = self.running_kv
        self._post("start_weight_update", body)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._post("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        if weight_version is None:
            raise ValueError("a pool's pushed weights need a weight_version (the policy version they serve as)")
        self.last_round = self._post("finish_weight_update", {"weight_version": int(weight_version)})

    def shutdown_weight_transfer_engine(self) -> None:
        self._post("shutdown_weight_transfer_engine", {})

    def _post(self, route: str, body: dict) -> dict:
        return _checked(httpx.post(f"{self.url}/{route}", json=body, headers=self.headers, timeout=self.timeout_s))


def _checked(response: httpx.Response) -> dict:
    if response.status_code != 200:
        raise RuntimeError(f"{response.request.url.path}: {response.status_code} {response.text[:500]}")
    return response.json()


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = gloo_weights.BACKEND

    master_address: str = "127.0.0.1"
    world_size: int = 0  # 0: asked from the pool (1 + its receiving ranks)
    master_port: int = 0  # 0: a free port
    bucket_bytes: int = gloo_weights.DEFAULT_BUCKET_BYTES
    timeout_s: float = gloo_weights.DEFAULT_TIMEOUT_S


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Rank 0 of the gloo group: hosts the rendezvous, then broadcasts the source's tensors every round."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source: WeightSource | None = None):
        if source is None:
            raise ValueError("the gloo trainer engine sends a WeightSource's tensors: pass one")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine.bucket_bytes = init_info.bucket_bytes
        world_size = init_info.world_size or 1 + client.world_size()
        store = gloo_weights.host_rendezvous(init_info.master_address, world_size, init_info.timeout_s,
                                             init_info.master_port)
        workers_info = {"master_address": init_info.master_address, "master_port": store.port,
                        "world_size": world_size, "bucket_bytes": init_info.bucket_bytes,
                        "timeout_s": init_info.timeout_s}
        # The receivers block in the rendezvous until the trainer joins: their call runs beside ours.
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, workers_info)
            engine.group = gloo_weights.join(init_info.master_address, store.port, 0, world_size,
                                             init_info.timeout_s, store=store)
            joined.result()
        engine.store = store  # rank 0 hosts the store for as long as the group lives
        return engine

    def send_weights(self, weight_version: int | None = None) -> None:
        """One round: the pool pauses, receives the source's tensors while they are broadcast, and serves them as
        `weight_version`."""
        meta = self.source.metadata()
        update = GlooUpdateInfo.of((m.name, m.dtype, m.shape) for m in meta)
        self.client.start_weight_update()
        with ThreadPoolExecutor(max_workers=1) as pool:
            received = pool.submit(self.client.update_weights, asdict(update))
            with torch.no_grad():
                gloo_weights.send(self.group, iter(self.source), update, self.bucket_bytes)
            received.result()
        self.client.finish_weight_update(None if weight_version is None else str(weight_version))

    def shutdown(self) -> None:
        self.client.shutdown_weight_transfer_engine()
        self.group = None


def attach_rewards(base_url: str, rewards: list[dict], api_key: str | None = None) -> None:
    """POST /v1/traces/rewards: each item names a served request (`request_id`, its response's id) or a session, and
    carries `reward` and/or `advantage` and `metrics` (docs/traces.md)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    _checked(httpx.post(f"{base_url.rstrip('/')}/v1/traces/rewards", json={"rewards": rewards}, headers=headers,
                        timeout=60))


def export_rl_dataset(store_dir: Path, out_dir: Path, team: str = "local", served: Collection[str] = (),
                      timeout_s: float = 30.0):
    """The served traces as the `rl` dataset (token ids, logprobs, each token's policy version, rewards), loaded
    with `datasets`, from the server's trace store (`<state_dir>/traces`).

    A served record reaches the store's Parquet when its WAL segment is sealed: within traces.flush_every_s (10 s by
    default) of being written. With `served` (request ids), the export is made again, a second apart, until every
    one of them is in it, for at most `timeout_s` (then it is returned as it is)."""
    import datasets
    import pyarrow.parquet as pq

    from trace_pipeline.export import export

    deadline = time.monotonic() + timeout_s
    while True:
        export(store_dir, out_dir, "rl", team, progress=False)
        parts = sorted(Path(out_dir).glob("*.parquet"))
        exported = {i for part in parts for i in pq.read_table(part, columns=["request_id"])["request_id"].to_pylist()}
        if set(served) <= exported or time.monotonic() > deadline:
            # built afresh: a part of an earlier attempt had the same name
            return datasets.load_dataset("parquet", data_dir=str(out_dir), split="train",
                                         download_mode="force_redownload")
        for part in parts:  # this export's own parts, made again with what has been sealed since
            part.unlink()
        time.sleep(1.0)


def register() -> None:
    """Makes backend "gloo" known to vLLM's trainer-side factory (`WeightTransferTrainerFactory.trainer_init`)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    if gloo_weights.BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(gloo_weights.BACKEND, GlooTrainerWeightTransferEngine)


class WeightPusher:
    """A trainer's model, connected to a pool: `push(version)` sends its current weights."""

    def __init__(self, engine: GlooTrainerWeightTransferEngine):
        self.engine = engine

    @classmethod
    def connect(cls, base_url: str, model: torch.nn.Module, api_key: str | None = None,
                master_address: str = "127.0.0.1", in_flight: str = "keep", running_kv: str | None = None,
                **init: Any) -> WeightPusher:
        client = PoolWeightSync(base_url, api_key, in_flight=in_flight, running_kv=running_kv)
        info = GlooTrainerInitInfo(rank=0, master_address=master_address, **init)
        return cls(GlooTrainerWeightTransferEngine.trainer_init(info, client=client, source=ModuleSource(model)))

    def push(self, version: int) -> dict:
        """Sends the model's weights as policy `version`; returns the pool's account of the round (`pauses_s`: how
        long each worker was paused; `status`), and `push_s`, the round as the trainer saw it."""
        started = time.monotonic()
        self.engine.send_weights(version)
        return {**self.engine.client.last_round, "push_s": time.monotonic() - started}

    def close(self) -> None:
        self.engine.shutdown()


register()  # trainers that build engines through vLLM's factory find backend "gloo"
