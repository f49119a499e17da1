"""The deploy routes' gatekeeping, without workers: admin keys only, requests validated before any deploy.

The deployer here gets a test double for its worker list (a pool with no reachable
worker); everything that touches real workers is in test_live_deploys.py.
"""

import asyncio
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from finetune_deploy.executor import Deployer
from finetune_deploy.registry import CheckpointRegistry
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from rollout_server.app import AppState, create_app
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.harness.checkpoints import copy_checkpoint, write_lora_adapter
from rollout_server.metrics import Metrics
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings


async def no_workers_double():
    return []


class RegistrationHeldRegistry(CheckpointRegistry):
    """Test double of the registry: a registration waits (in whatever thread runs it) until the test lets it go."""

    def __init__(self, engine):
        super().__init__(engine)
        self.entered, self.release = threading.Event(), threading.Event()

    def register(self, *args, **kwargs):
        self.entered.set()
        self.release.wait(timeout=10)  # bounded: run on the event loop, it would stall the test, not hang it
        return super().register(*args, **kwargs)


def deploy_app(tmp_path, base_dir, registry_class=CheckpointRegistry):
    """The front door app with only its deploy routes' state: (app, admin headers, member headers, registry)."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    database = open_database(url)
    keys = KeyStore(database)
    admin, member = keys.create("ops", is_admin=True), keys.create("team-a")
    registry = registry_class(create_engine(url))
    registry.register_base("default", base_dir, "tiny-qwen2")
    models = ModelTable("tiny-qwen2", 0, str(base_dir))
    deployer = Deployer(registry, models, no_workers_double, DeploySettings(checkpoint_roots=[tmp_path]))
    ctx = ServingContext(settings=Settings(database_url=url), tokenizer=None, client=None, metrics=Metrics(),
                         models=models, max_model_len=32768)
    app = create_app(AppState(ctx=ctx, auth=Authenticator(keys), deployer=deployer))
    return app, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {member}"}, registry


@pytest.fixture
def app_and_keys(tmp_path, base_dir):
    app, admin, member, _ = deploy_app(tmp_path, base_dir)
    return TestClient(app), admin, member


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
        ({"path": str(copy_checkpoint(finetuned_dir, tmp_path / "unstable", stable=False))}, "path", 409),
    ]
    for body, param, status in cases:
        answer = app.post("/v1/admin/deployments", json=body, headers=admin)
        assert (answer.status_code, answer.json()["error"]["param"]) == (status, param), body
    for not_json in (b"{nope", b'{"path": "\xff"}', b"[" * 100_000 + b"]" * 100_000):
        malformed = app.post("/v1/admin/deployments", content=not_json, headers=admin)
        assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    no_earlier = app.post("/v1/admin/deployments/rollback", json={}, headers=admin)
    assert no_earlier.status_code == 409 and no_earlier.json()["error"]["param"] == "to_version"
    assert app.get("/v1/admin/deployments/7", headers=admin).status_code == 404
    past_int64 = app.get(f"/v1/admin/deployments/{2**63}", headers=admin)
    assert (past_int64.status_code, past_int64.json()["error"]["param"]) == (400, "version")
    listed = app.get("/v1/admin/deployments", headers=admin).json()
    assert [(v["version"], v["status"]) for v in listed["data"]] == [(0, "serving")]


def test_a_path_the_server_cannot_look_into_is_a_refused_checkpoint(app_and_keys, tmp_path):
    app, admin, _ = app_and_keys
    too_long = str(tmp_path / ("x" * 300))  # under the deploy root: outside, the path itself is refused first
    for body in ({"path": too_long}, {"path": too_long, "as": "full"}):
        answer = app.post("/v1/admin/deployments", json=body, headers=admin)  # ENAMETOOLONG, not a 500
        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (409, "invalid_checkpoint", "path")
        assert "File name too long" in error["message"]


def test_unloading_an_adapter_the_pool_does_not_serve_is_a_404(app_and_keys):
    app, admin, _ = app_and_keys
    answer = app.post("/v1/rl/update_weights", headers=admin,
                      json={"version": 1, "target": {"kind": "lora", "op": "unload", "name": "nobody"}})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (404, "adapter_not_found", "target.name")


def test_a_lora_adapter_for_workers_without_lora_is_refused_naming_the_flag(app_and_keys, tmp_path, base_dir):
    app, admin, _ = app_and_keys  # its deployer's workers started without --enable-lora (the default)
    adapter = str(write_lora_adapter(tmp_path / "coder-lora", base_dir))
    deploy = app.post("/v1/admin/deployments", json={"path": adapter}, headers=admin)
    rl = app.post("/v1/rl/update_weights", headers=admin, json={
        "version": 1, "target": {"kind": "lora", "op": "load", "name": "coder"},
        "transport": {"filesystem": {"path": adapter}}})
    for answer, param in ((deploy, "path"), (rl, "transport.filesystem.path")):
        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (409, "lora_not_enabled", param)
        assert "--enable-lora" in error["message"]
    listed = app.get("/v1/admin/deployments", headers=admin).json()
    assert [v["version"] for v in listed["data"]] == [0]  # nothing was registered


def test_a_registration_runs_off_the_event_loop_and_holds_off_a_second_deploy(tmp_path, base_dir, finetuned_dir):
    """Registering hashes every weight file (seconds for a large checkpoint): meanwhile the server answers, and
    a second deploy or a rollback is refused (409) before it registers anything. (The pool here has no worker,
    as a pool scaled to zero: the deploy then has nothing to move, and the version serves at once.)"""
    app, admin, _, registry = deploy_app(tmp_path, base_dir, RegistrationHeldRegistry)
    first_path = str(copy_checkpoint(finetuned_dir, tmp_path / "step-100"))
    second_path = str(copy_checkpoint(finetuned_dir, tmp_path / "step-200"))

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as client:
            first = asyncio.create_task(client.post("/v1/admin/deployments", json={"path": first_path}, headers=admin))
            assert await asyncio.to_thread(registry.entered.wait, 10)
            listed = await asyncio.wait_for(client.get("/v1/admin/deployments", headers=admin), 5)
            second = await asyncio.wait_for(
                client.post("/v1/admin/deployments", json={"path": second_path}, headers=admin), 5)
            rollback = await asyncio.wait_for(client.post("/v1/admin/deployments/rollback", json={}, headers=admin), 5)
            registry.release.set()
            first = await asyncio.wait_for(first, 30)
            for _ in range(100):  # the deploy goes on after its 202 (no workers here: it ends at once)
                after = (await client.get("/v1/admin/deployments", headers=admin)).json()["data"]
                if after[-1]["status"] == "serving":
                    break
                await asyncio.sleep(0.05)
            return listed, second, rollback, first, after

    listed, second, rollback, first, after = asyncio.run(run())
    assert [v["version"] for v in listed.json()["data"]] == [0]  # answered while the registration ran
    for refused in (second, rollback):
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "deploy_in_progress")
        assert refused.headers["retry-after"] == "5"
    assert first.status_code == 202 and first.json()["version"] == 1
    assert [(v["version"], v["path"], v["status"]) for v in after] == [
        (0, str(base_dir.resolve()), "retired"), (1, str((tmp_path / "step-100").resolve()), "serving")]
