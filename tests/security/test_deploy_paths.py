"""Deploy paths (#46, item 7): checkpoints only from under the deploy roots, file names a checkpoint lists held
inside its directory, and what was validated is what loads.

The route tests run the front door app with its deploy routes (tests/deploy/test_deploy_api.py's `deploy_app`,
whose deploy root is the directory given to it). The load tests drive the real deployer and registry over a test
double of WorkerControl that records what each worker is told to load; tests/deploy/test_live_deploys.py
deploys to real workers.
"""

import asyncio
import json
import os
import shutil
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from engine.supervisor.worker_control import WorkerHandle
from finetune_deploy import executor
from finetune_deploy.checkpoint_files import CheckpointChanged, UnsafeCheckpointPath, read_weights
from finetune_deploy.checkpoints import validate_checkpoint, verify_unchanged
from finetune_deploy.executor import Deployer, DeployError
from finetune_deploy.registry import CheckpointRegistry
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from finetune_deploy.weight_update import WeightUpdate
from rollout_server.harness.checkpoints import copy_checkpoint, rewrite_weights, shard_weights, write_lora_adapter
from rollout_server.settings import Settings
from tests.deploy.test_deploy_api import deploy_app
from tests.tiny_models import untrained_tiny_model

POOL = "default"


@pytest.fixture(scope="module")
def base_dir():
    return untrained_tiny_model(0)


@pytest.fixture(scope="module")
def finetuned_dir():
    return untrained_tiny_model(1)


@pytest.fixture
def dirs(tmp_path):
    """(root, outside): the deploy root, and a directory beside it that is no root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside


@pytest.fixture
def app(dirs, base_dir):
    """(client, admin headers, registry) of the front door whose only deploy root is `root`."""
    app, admin, _, registry = deploy_app(dirs[0], base_dir)
    return TestClient(app), admin, registry


def refused_path(answer, param: str) -> dict:
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (403, "checkpoint_path_not_allowed", param), error
    return error


# ---- roots -------------------------------------------------------------------------------------------------


def test_a_checkpoint_outside_every_root_is_a_403_listing_the_roots(app, dirs, finetuned_dir):
    client, admin, registry = app
    root, outside = dirs
    elsewhere = str(copy_checkpoint(finetuned_dir, outside / "step-100"))  # a checkpoint fit to serve
    for route, body, param in (
            ("/v1/admin/deployments", {"path": elsewhere}, "path"),
            ("/update_weights", {"weight_dir": elsewhere}, "weight_dir"),
            ("/v1/rl/update_weights", {"version": 1, "target": {"kind": "base"},
                                       "transport": {"filesystem": {"path": elsewhere}}}, "transport.filesystem.path")):
        error = refused_path(client.post(route, json=body, headers=admin), param)
        assert elsewhere in error["message"] and str(root.resolve()) in error["message"]
    assert [v.version for v in registry.list(POOL)] == [0]  # nothing registered


def test_a_path_holding_a_nul_byte_is_a_403_not_a_500(app, dirs):
    client, admin, registry = app
    root, _ = dirs
    answer = client.post("/update_weights", json={"weight_dir": f"{root}/step\u0000-100"}, headers=admin)
    assert "NUL byte" in refused_path(answer, "weight_dir")["message"]
    assert [v.version for v in registry.list(POOL)] == [0]


def test_a_symlink_from_a_root_to_outside_is_a_403(app, dirs, finetuned_dir):
    client, admin, registry = app
    root, outside = dirs
    (root / "step-100").symlink_to(copy_checkpoint(finetuned_dir, outside / "step-100"))
    refused_path(client.post("/v1/admin/deployments", json={"path": str(root / "step-100")}, headers=admin), "path")
    # A checkpoint under the root whose config is a symlink to a file outside it: the same refusal
    inside = copy_checkpoint(finetuned_dir, root / "step-200")
    shutil.move(inside / "config.json", outside / "config.json")
    (inside / "config.json").symlink_to(outside / "config.json")
    error = refused_path(client.post("/v1/admin/deployments", json={"path": str(inside)}, headers=admin), "path")
    assert "'config.json'" in error["message"] and "symlink" in error["message"]
    assert [v.version for v in registry.list(POOL)] == [0]


def test_a_lora_adapter_outside_the_roots_is_a_403(app, dirs, base_dir):
    client, admin, _ = app
    adapter = str(write_lora_adapter(dirs[1] / "coder", base_dir))
    refused_path(client.post("/v1/admin/deployments", json={"path": adapter}, headers=admin), "path")


def test_the_roots_setting_takes_a_path_list_as_path_does(monkeypatch):
    assert [str(p) for p in Settings(deploy_checkpoint_roots="/ckpt:/mnt/models").deploy.checkpoint_roots] == [
        "/ckpt", "/mnt/models"]
    monkeypatch.setenv("ROLLOUT_SERVE_DEPLOY__CHECKPOINT_ROOTS", "/a:/b")
    assert [str(p) for p in Settings().deploy.checkpoint_roots] == ["/a", "/b"]


# ---- file names a checkpoint lists ---------------------------------------------------------------------------


@pytest.mark.parametrize("escape", ["../../outside/{shard}", "{outside}/{shard}"])
def test_a_shard_named_outside_the_checkpoint_is_a_403_naming_it(app, dirs, finetuned_dir, escape):
    client, admin, registry = app
    root, outside = dirs
    checkpoint = copy_checkpoint(finetuned_dir, root / "step-100")
    shards = shard_weights(checkpoint)
    shutil.move(checkpoint / shards[0], outside / shards[0])  # a real shard, read from outside if followed
    index = checkpoint / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    named = escape.format(shard=shards[0], outside=outside)
    data["weight_map"] = {name: named if shard == shards[0] else shard for name, shard in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    error = refused_path(client.post("/v1/admin/deployments", json={"path": str(checkpoint)}, headers=admin), "path")
    assert repr(named) in error["message"]
    assert [v.version for v in registry.list(POOL)] == [0]


def test_a_shard_symlinked_out_of_the_checkpoint_is_refused(dirs, finetuned_dir):
    root, outside = dirs
    checkpoint = copy_checkpoint(finetuned_dir, root / "step-100")
    shards = shard_weights(checkpoint)
    shutil.move(checkpoint / shards[1], outside / shards[1])
    (checkpoint / shards[1]).symlink_to(outside / shards[1])
    with pytest.raises(UnsafeCheckpointPath) as refused:
        read_weights(checkpoint)
    assert refused.value.field == "files" and shards[1] in refused.value.message


# ---- what was validated is what loads --------------------------------------------------------------------


def change_weights(checkpoint) -> None:
    rewrite_weights(checkpoint, lambda tensors: next(iter(tensors.values())).add_(1))


def test_a_file_written_in_place_is_caught_even_with_its_mtime_put_back(dirs, finetuned_dir, base_dir):
    checkpoint = copy_checkpoint(finetuned_dir, dirs[0] / "step-100")
    validated = validate_checkpoint(checkpoint, base_dir)
    state = verify_unchanged(checkpoint, "full", validated.fingerprint, validated.files_state)
    weights = checkpoint / "model.safetensors"
    os.utime(weights)  # touched, same bytes: hashed again, still the checkpoint validated
    state = verify_unchanged(checkpoint, "full", validated.fingerprint, state)
    before = weights.stat()
    with open(weights, "r+b") as f:  # same size, same inode, mtime set back: only ctime tells
        f.seek(before.st_size - 4)
        f.write(bytes(4 * [0x7F]))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(CheckpointChanged) as refused:
        verify_unchanged(checkpoint, "full", validated.fingerprint, state)
    assert "changed since it was validated" in refused.value.message


class WorkerControlDouble:
    """Test double of engine's WorkerControl: records the weights each worker is told to load."""

    loads: ClassVar[list[tuple[str, str]]] = []  # (worker, path); each test starts it empty

    def __init__(self, worker: WorkerHandle, *args, **kwargs):
        self.worker = worker

    async def pause(self, mode) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def flush_cache(self) -> None:
        pass

    async def load_weights(self, path, version, running_kv="keep") -> None:
        self.loads.append((self.worker.name, str(path)))


async def two_workers():
    return [WorkerHandle(0, 18080, instance_id=1), WorkerHandle(1, 18081, instance_id=2)]


def deployer_over_doubles(tmp_path, base_dir, root, monkeypatch) -> Deployer:
    """A deployer of two test-double workers, over a registry in tmp_path (as a fresh process opens it)."""
    monkeypatch.setattr(executor, "WorkerControl", WorkerControlDouble)
    monkeypatch.setattr(WorkerControlDouble, "loads", [])
    registry = CheckpointRegistry(create_engine(f"sqlite:///{tmp_path / 'state.db'}"))
    registry.register_base(POOL, base_dir, "tiny-qwen2")
    return Deployer(registry, ModelTable("tiny-qwen2", 0, str(base_dir)), two_workers,
                    DeploySettings(checkpoint_roots=[root]))


def test_a_checkpoint_changed_after_validation_is_not_rolled_back_to(tmp_path, dirs, finetuned_dir, base_dir,
                                                                      monkeypatch):
    deployer = deployer_over_doubles(tmp_path, base_dir, dirs[0], monkeypatch)
    first, second = (copy_checkpoint(finetuned_dir, dirs[0] / name) for name in ("step-100", "step-200"))
    for checkpoint in (first, second):
        asyncio.run(deployer.register_and_deploy(WeightUpdate("full", "load", checkpoint)))
    change_weights(first)
    WorkerControlDouble.loads.clear()
    with pytest.raises(DeployError, match="changed since it was validated"):
        asyncio.run(deployer.rollback())
    assert str(first) not in {path for _, path in WorkerControlDouble.loads}
    assert deployer.models.base.policy_version == 2 and deployer.registry.current(POOL).version == 2
    assert deployer.registry.get(POOL, 1).status == "failed"


def test_a_checkpoint_changed_while_the_server_was_down_is_not_restored(tmp_path, dirs, finetuned_dir, base_dir,
                                                                        monkeypatch):
    checkpoint = copy_checkpoint(finetuned_dir, dirs[0] / "step-100")
    deployer = deployer_over_doubles(tmp_path, base_dir, dirs[0], monkeypatch)
    asyncio.run(deployer.register_and_deploy(WeightUpdate("full", "load", checkpoint)))
    change_weights(checkpoint)
    restarted = deployer_over_doubles(tmp_path, base_dir, dirs[0], monkeypatch)  # no state remembered
    asyncio.run(restarted.restore())
    assert WorkerControlDouble.loads == [] and restarted.models.base.policy_version == 0  # the base serves on
    # A worker started later while version 1 serves (here: the first process) is refused it, not handed it
    with pytest.raises(CheckpointChanged):
        deployer.weights_for_new_workers()
