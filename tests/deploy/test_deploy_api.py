"""The deploy routes' gatekeeping, without workers: admin keys only, requests validated before any deploy.

The deployer here gets a test double for its worker list (a pool with no reachable
worker); everything that touches real workers is in test_live_deploys.py.
"""

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from finetune_deploy.executor import Deployer
from finetune_deploy.settings import DeploySettings
from finetune_deploy.registry import CheckpointRegistry
from rollout_server.app import AppState, create_app
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.generation import ServingContext
from rollout_server.metrics import Metrics
from rollout_server.served_models import ModelTable
from rollout_server.settings import Settings
from tests.deploy.checkpoint_factory import copy_checkpoint, write_lora_adapter


async def no_workers_double():
    return []


@pytest.fixture
def app_and_keys(tmp_path, base_dir):
    url = f"sqlite:///{tmp_path / 'state.db'}"
    database = open_database(url)
    keys = KeyStore(database)
    admin, member = keys.create("ops", is_admin=True), keys.create("team-a")
    registry = CheckpointRegistry(create_engine(url))
    registry.register_base("default", base_dir, "tiny-qwen2")
    models = ModelTable("tiny-qwen2", 0, str(base_dir))
    deployer = Deployer(registry, models, no_workers_double, DeploySettings())
    ctx = ServingContext(settings=Settings(database_url=url), tokenizer=None, client=None, metrics=Metrics(),
                         models=models, max_model_len=32768)
    app = TestClient(create_app(AppState(ctx=ctx, auth=Authenticator(keys), deployer=deployer)))
    return app, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {member}"}


@pytest.mark.parametrize("path, body", [
    ("/v1/admin/deployments", {"path": "/ckpt"}),
    ("/v1/admin/deployments/rollback", {}),
    ("/update_weights", {"weight_dir": "/ckpt"}),
    ("/v1/rl/update_weights", {"version": 1, "target": {"kind": "base"}, "transport": {"filesystem": {"path": "/c"}}}),
    ("/pause", {}),
    ("/v1/rl/resume", {}),
])
def test_weight_routes_need_an_admin_key(app_and_keys, path, body):
    app, _, member = app_and_keys
    refused = app.post(path, json=body, headers=member)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    assert app.post(path, json=body).status_code == 401


def test_requests_are_validated_naming_the_field(app_and_keys, tmp_path, finetuned_dir):
    app, admin, _ = app_and_keys
    cases = [
        ({"path": "relative/dir"}, "path", 400),
        ({"path": "/ckpt", "as": "delta"}, "as", 400),
        ({"path": "/ckpt", "mode": "sideways"}, "mode", 400),
        ({"path": "/ckpt", "pool": "gpu-east"}, "pool", 404),
        ({"path": str(copy_checkpoint(finetuned_dir, tmp_path / "unstable", stable=False))}, "path", 400),
    ]
    for body, param, status in cases:
        answer = app.post("/v1/admin/deployments", json=body, headers=admin)
        assert (answer.status_code, answer.json()["error"]["param"]) == (status, param), body
    malformed = app.post("/v1/admin/deployments", content=b"{nope", headers=admin)
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    no_earlier = app.post("/v1/admin/deployments/rollback", json={}, headers=admin)
    assert no_earlier.status_code == 400 and no_earlier.json()["error"]["param"] == "to_version"
    assert app.get("/v1/admin/deployments/7", headers=admin).status_code == 404
    listed = app.get("/v1/admin/deployments", headers=admin).json()
    assert [(v["version"], v["status"]) for v in listed["data"]] == [(0, "serving")]


def test_a_lora_adapter_for_workers_without_lora_is_refused_naming_the_flag(app_and_keys, tmp_path, base_dir):
    app, admin, _ = app_and_keys  # its deployer's workers started without --enable-lora (the default)
    adapter = str(write_lora_adapter(tmp_path / "coder-lora", base_dir))
    deploy = app.post("/v1/admin/deployments", json={"path": adapter}, headers=admin)
    rl = app.post("/v1/rl/update_weights", headers=admin, json={
        "version": 1, "target": {"kind": "lora", "op": "load", "name": "coder"},
        "transport": {"filesystem": {"path": adapter}}})
    for answer, param in ((deploy, "path"), (rl, "transport.filesystem.path")):
        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (400, "lora_not_enabled", param)
        assert "--enable-lora" in error["message"]
    listed = app.get("/v1/admin/deployments", headers=admin).json()
    assert [v["version"] for v in listed["data"]] == [0]  # nothing was registered
