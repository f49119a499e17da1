"""Unloading a LoRA adapter retires it even when a worker no longer holds it (one restarted without it, say):
the operator gets the adapter gone and the worker's complaint in the progress record, not a 500.

The workers here are test doubles of `WorkerControl`; tests/deploy/test_live_deploys.py unloads from real ones."""

import asyncio

from sqlalchemy import create_engine

from engine.supervisor.worker_control import WorkerControlError, WorkerHandle
from finetune_deploy import executor
from finetune_deploy.executor import Deployer
from finetune_deploy.registry import CheckpointRegistry
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from rollout_server.harness.checkpoints import write_lora_adapter


class WorkerControlDouble:
    """Worker 1 says it has no such adapter, as a worker restarted without it does."""

    unloaded: list[tuple[str, str]] = []

    def __init__(self, worker: WorkerHandle):
        self.worker = worker

    async def unload_lora(self, name: str) -> None:
        if self.worker.index == 1:
            raise WorkerControlError(f"{self.worker.name}: unload_lora: LoRA adapter {name!r} not found")
        self.unloaded.append((self.worker.name, name))


def test_an_adapter_is_retired_also_when_a_worker_no_longer_holds_it(tmp_path, base_dir, monkeypatch):
    registry = CheckpointRegistry(create_engine(f"sqlite:///{tmp_path / 'state.db'}"))
    registry.register_base("default", base_dir, "tiny-qwen2")
    adapter = registry.register("default", write_lora_adapter(tmp_path / "coder", base_dir), name="coder")
    for status in ("deploying", "serving"):
        registry.mark_status("default", adapter.version, status)
    models = ModelTable("tiny-qwen2", 0, str(base_dir))
    models.adapter_loaded("coder", adapter.version, adapter.path)

    async def two_workers():
        return [WorkerHandle(0, 18080), WorkerHandle(1, 18081)]

    monkeypatch.setattr(executor, "WorkerControl", WorkerControlDouble)
    deployer = Deployer(registry, models, two_workers, DeploySettings(), lora_enabled=True)
    progress = asyncio.run(deployer.unload_adapter("coder"))

    assert WorkerControlDouble.unloaded == [("worker-0", "coder")]
    assert (progress.status, progress.steps_done) == ("retired", 2) and "not found" in progress.error
    assert registry.serving_adapters("default") == [] and "coder" not in models.adapters
