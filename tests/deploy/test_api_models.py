"""Deploy request bodies: three shapes, one WeightUpdate; every refusal an OpenAI-style 400 naming the field."""

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from finetune_deploy.checkpoints import CheckpointError, validate_checkpoint
from rollout_server.errors import APIError, install_error_handlers
from rollout_server.harness.checkpoints import copy_checkpoint
from rollout_server.routes.deployment_bodies import (
    DeploymentRequest,
    PrimeUpdateWeightsRequest,
    RLUpdateWeightsRequest,
    WeightUpdate,
    checkpoint_api_error,
    parse_request,
)


def refusal(model, body) -> dict:
    with pytest.raises(APIError) as caught:
        parse_request(model, body)
    assert caught.value.status == 400
    return caught.value.body()["error"]


def test_a_deployment_names_its_path_pool_kind_and_name():
    request = parse_request(DeploymentRequest, {"path": "/ckpt/step-100", "pool": "qwen", "as": "lora",
                                                "name": "qwen-sft-v2"})
    assert request.weight_update() == WeightUpdate(kind="lora", op="load", path=Path("/ckpt/step-100"),
                                                   name="qwen-sft-v2", pool="qwen")


def test_a_deployment_without_kind_or_name_takes_them_from_the_directory(tmp_path):
    (tmp_path / "my-adapter").mkdir()
    (tmp_path / "my-adapter" / "adapter_config.json").write_text("{}")
    update = parse_request(DeploymentRequest, {"path": str(tmp_path / "my-adapter"), "pool": "qwen"}).weight_update()
    assert (update.kind, update.name) == ("lora", "my-adapter")
    full = parse_request(DeploymentRequest, {"path": str(tmp_path), "pool": "qwen"}).weight_update()
    assert full.kind == "full"


@pytest.mark.parametrize("body, param, code", [
    ({"pool": "qwen"}, "path", "missing_required_parameter"),
    ({"path": "ckpt/step-100", "pool": "qwen"}, "path", "invalid_value"),
    ({"path": "/ckpt", "pool": "qwen", "as": "delta"}, "as", "invalid_value"),
    ({"path": "/ckpt", "pool": "../etc"}, "pool", "invalid_value"),
    ({"path": "/ckpt", "pool": "qwen", "kind": "lora"}, "kind", "invalid_value"),  # a typo must not deploy
])
def test_a_bad_deployment_is_a_400_naming_the_field(body, param, code):
    error = refusal(DeploymentRequest, body)
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert param in error["message"]


def test_prime_rl_update_weights_shape():
    update = parse_request(PrimeUpdateWeightsRequest, {"weight_dir": "/run/step_12", "extra": 1}).weight_update()
    assert (update.kind, update.op, str(update.path), update.version) == ("full", "load", "/run/step_12", None)
    assert refusal(PrimeUpdateWeightsRequest, {})["param"] == "weight_dir"
    assert refusal(PrimeUpdateWeightsRequest, {"weight_dir": "step_12"})["param"] == "weight_dir"


def test_dynamo_rl_update_weights_shape():
    base = parse_request(RLUpdateWeightsRequest, {"version": "12", "target": {"kind": "base", "op": "load"},
                                                  "transport": {"filesystem": {"path": "/run/step_12"}},
                                                  "pause_mode": "keep"}).weight_update()
    assert (base.kind, base.op, str(base.path), base.version) == ("full", "load", "/run/step_12", 12)
    swap = parse_request(RLUpdateWeightsRequest, {"version": 13, "target": {"kind": "lora", "op": "swap",
                                                                            "name": "policy"},
                                                  "transport": {"filesystem": {"path": "/run/lora_13"}}})
    assert (swap.weight_update().kind, swap.weight_update().name) == ("lora", "policy")
    unload = parse_request(RLUpdateWeightsRequest, {"version": 14, "target": {"kind": "lora", "op": "unload",
                                                                              "name": "policy"}})
    assert unload.weight_update().path is None


@pytest.mark.parametrize("body, param, words", [
    ({"target": {"kind": "base"}, "transport": {"filesystem": {"path": "/a"}}}, "version", "Missing"),
    ({"version": "v12", "target": {"kind": "base"}, "transport": {"filesystem": {"path": "/a"}}}, "version", "integer"),
    ({"version": 1, "target": {"kind": "base", "op": "unload"}}, "target", "only supports op 'load'"),
    ({"version": 1, "target": {"kind": "lora", "op": "load"}, "transport": {"filesystem": {"path": "/a"}}},
     "target", "needs a 'name'"),
    ({"version": 1, "target": {"kind": "base"}, "transport": {"nccl": {"group": "g"}}}, "transport", "'nccl'"),
    ({"version": 1, "target": {"kind": "base"}, "transport": {"filesystem": {"path": "rel"}}},
     "transport.filesystem.path", "absolute"),
    ({"version": 1, "target": {"kind": "base"}}, "transport", "transport.filesystem.path is required"),
])
def test_a_bad_rl_update_is_a_400(body, param, words):
    error = refusal(RLUpdateWeightsRequest, body)
    assert error["param"] == param and words in error["message"]


def test_a_refused_checkpoint_becomes_a_409_on_the_path(tmp_path, finetuned_dir, base_dir):
    unfinished = copy_checkpoint(finetuned_dir, tmp_path / "writing", stable=False)
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(unfinished, base_dir)
    error = checkpoint_api_error(caught.value, param="weight_dir")
    body = error.body()["error"]
    assert error.status == 409 and body["param"] == "weight_dir" and body["code"] == "invalid_checkpoint"
    assert body["message"].startswith("Checkpoint refused (files):") and "STABLE" in body["message"]


def test_the_models_serve_as_fastapi_bodies_with_the_project_error_handlers():
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/rl/update_weights")
    async def update(body: RLUpdateWeightsRequest):
        return {"version": body.weight_update().version}

    client = TestClient(app)
    ok = client.post("/v1/rl/update_weights", json={"version": 3, "target": {"kind": "base"},
                                                     "transport": {"filesystem": {"path": "/ckpt"}}})
    assert ok.status_code == 200 and ok.json() == {"version": 3}
    bad = client.post("/v1/rl/update_weights", json={"version": 3, "target": {"kind": "tensor"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "target.kind"
