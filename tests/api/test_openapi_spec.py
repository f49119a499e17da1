"""/openapi.json describes every route the front door serves, and says what validation accepts.

The app is built in-process with every optional router on (traces, usage, deploys, batches) and an untrained
tiny model; no stack starts. tests/api/clients/test_schemathesis.py tests the document against a live server.
"""

import asyncio
import re

import jsonschema
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine

from engine.client.dispatch import Dispatcher
from engine.client.dynamo_http import DynamoFrontendClient
from engine.supervisor.pool_config import PoolConfig
from engine.supervisor.pools import Deployment, Pool, PoolSet
from finetune_deploy.executor import Deployer
from finetune_deploy.registry import CheckpointRegistry
from finetune_deploy.served_models import ModelTable
from finetune_deploy.settings import DeploySettings
from rollout_server.app import AppState, create_app
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.generation_routes import GENERATION_ROUTES
from rollout_server.harness.stack import free_port_block
from rollout_server.metrics import Metrics
from rollout_server.protocol import DetokenizeRequest, TokenizeRequest
from rollout_server.routes.batches import CreateBatchBody
from rollout_server.routes.deployment_bodies import (
    DeploymentRequest,
    PrimeUpdateWeightsRequest,
    RLUpdateWeightsRequest,
    RollbackRequest,
)
from rollout_server.routes.rewards import RewardsBody
from rollout_server.server import batch_runner
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings
from rollout_server.times import unix_time
from rollout_server.tokenizer import ModelTokenizer
from rollout_server.tracing import TraceHook
from rollout_server.usage import UsageRecorder, UsageStore, parse_group_by
from tests.tiny_models import untrained_tiny_model
from trace_pipeline.capture import TraceCapture
from trace_pipeline.settings import TraceSettings

# The model each route that takes a JSON body validates it with
BODY_MODELS = {
    ("post", "/tokenize"): TokenizeRequest, ("post", "/detokenize"): DetokenizeRequest,
    ("post", "/v1/traces/rewards"): RewardsBody, ("post", "/v1/batches"): CreateBatchBody,
    ("post", "/v1/admin/deployments"): DeploymentRequest, ("post", "/v1/admin/deployments/rollback"): RollbackRequest,
    ("post", "/update_weights"): PrimeUpdateWeightsRequest, ("post", "/v1/rl/update_weights"): RLUpdateWeightsRequest,
    **{("post", path): route.body for path, route in GENERATION_ROUTES.items()},
}
BODILESS = {"/pause", "/resume", "/v1/rl/pause", "/v1/rl/resume", "/v1/batches/{batch_id}/cancel"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the app's client, the tokenizer): the front door with every router, open mode, no engine behind it."""
    tmp = tmp_path_factory.mktemp("openapi")
    model_dir = untrained_tiny_model()
    url = f"sqlite:///{tmp / 'state.db'}"
    settings = Settings(database_url=url, state_dir=tmp)
    nowhere = DynamoFrontendClient(f"http://127.0.0.1:{free_port_block(1)}", 10)
    pool = Pool(PoolConfig(name="default", kind="shared"), [Deployment("default/0", None, nowhere, 1)])
    pools = PoolSet(settings, [pool])
    models = ModelTable("tiny-qwen2", 0, str(model_dir))
    tokenizer = ModelTokenizer(model_dir)
    ctx = ServingContext(settings=settings, tokenizer=tokenizer, client=Dispatcher(pools), metrics=Metrics(),
                         models=models, max_model_len=32768)
    registry = CheckpointRegistry(create_engine(url))
    registry.register_base("default", model_dir, "tiny-qwen2")

    async def no_workers():
        return []

    database = open_database(url)
    state = AppState(ctx=ctx, auth=Authenticator(KeyStore(database), open_mode=True),
                     usage=UsageRecorder(UsageStore(database)),
                     traces=TraceHook(TraceCapture(TraceSettings(dir=tmp / "traces"))),
                     # Every path under a deploy root: this module checks the schema, tests/security the roots
                     deployer=Deployer(registry, models, no_workers, DeploySettings(checkpoint_roots=["/"])),
                     batches=batch_runner(settings, ctx))
    yield TestClient(create_app(state), client=("127.0.0.1", 50000)), tokenizer  # open mode serves loopback
    asyncio.run(ctx.client.close())


@pytest.fixture(scope="module")
def document(served):
    answer = served[0].get("/openapi.json")
    assert answer.status_code == 200
    return answer.json()


def operations(document):
    return [(method, path, op) for path, methods in document["paths"].items() for method, op in methods.items()]


def test_every_route_the_app_serves_is_in_the_document(served, document):
    fastapi_app = served[0].app.app.app  # behind the body deadline and the generation routes
    served_routes = {(method.lower(), route.path_format) for route in fastapi_app.routes
                     if isinstance(route, APIRoute) for method in route.methods}
    served_routes |= {("post", path) for path in GENERATION_ROUTES}
    assert {(method, path) for method, path, _ in operations(document)} == served_routes


def test_a_route_that_takes_a_body_describes_it_with_the_model_it_validates_with(document):
    for method, path, op in operations(document):
        if method != "post" or path in BODILESS:
            assert "requestBody" not in op, (method, path)
            continue
        content = op["requestBody"]["content"]
        if path == "/v1/files":  # multipart: the file and its purpose
            schema = resolved(document, content["multipart/form-data"]["schema"])
            assert schema["required"] == ["file"] and schema["properties"]["file"]["format"] == "binary"
            continue
        schema = resolved(document, content["application/json"]["schema"])
        model_schema = BODY_MODELS[(method, path)].model_json_schema(by_alias=True)
        assert schema["title"] == model_schema["title"], path
        assert schema.get("required") == model_schema.get("required"), path
        assert set(schema["properties"]) == set(model_schema["properties"]), path
    assert document["paths"]["/v1/admin/deployments/rollback"]["post"]["requestBody"]["required"] is False  # {}


def test_no_operation_lists_422_and_every_error_is_the_openai_error_json(document):
    assert "HTTPValidationError" not in document["components"]["schemas"]
    error_json = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for method, path, op in operations(document):
        assert "422" not in op["responses"], (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400 and path != "/health":  # /health's 503 is its own body
                assert response["content"] == error_json, (method, path, status)
    error = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}
    validator(document, {"$ref": "#/components/schemas/ErrorBody"}).validate(error)


def test_each_route_lists_the_statuses_its_handler_answers(document):
    def statuses(method, path):
        return set(document["paths"][path][method]["responses"])
    for path in GENERATION_ROUTES:
        assert statuses("post", path) == {"200", "400", "401", "403", "404", "409", "413", "429", "503", "504"}
        assert set(document["paths"][path]["post"]["responses"]["200"]["content"]) == {
            "application/json", "text/event-stream"}
    assert statuses("post", "/v1/admin/deployments") == {"200", "202", "400", "401", "403", "404", "409", "413",
                                                          "502"}
    assert {"400", "401", "403"} <= statuses("get", "/v1/usage")
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(document["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]) == {
        "application/jsonl"}


def test_every_reference_resolves(document):
    def refs(node):
        if isinstance(node, dict):
            yield from ([node["$ref"]] if "$ref" in node else [])
            for child in node.values():
                yield from refs(child)
        elif isinstance(node, list):
            for child in node:
                yield from refs(child)
    found = set(refs(document))
    assert found and all(ref.removeprefix("#/components/schemas/") in document["components"]["schemas"]
                         for ref in found), found


def test_a_405_names_every_method_its_path_is_served_with(served):
    client = served[0]
    for path, allowed in (("/v1/admin/deployments", "GET, POST"), ("/v1/admin/deployments/rollback", "POST"),
                          ("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        answer = client.request("PUT", path)
        assert (answer.status_code, answer.headers.get("allow")) == (405, allowed), path
        assert answer.json()["error"]["type"] == "invalid_request_error"


# The schema says what the server takes: a body it accepts is never a 400, one it refuses always is. Lax mode,
# refused fields and rules across fields, value by value. Model "m" does not exist: a body past validation is a 404.
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RL_BASE = {"version": 1, "target": {"kind": "base"}}
AGREEMENT = [
    *[("/v1/chat/completions", {**CHAT, field: value}) for field in ("logit_bias", "priority", "chat_template")
      for value in (None, False, 0, "", [], {}, True, 1, "x", [1], {"a": 1})],
    *[("/v1/chat/completions", {**CHAT, "stream": value})
      for value in (True, False, 0, 1, 2, "true", "No", "ON", "", "maybe", None, 0.5)],
    *[("/v1/chat/completions", {**CHAT, "echo": value}) for value in (False, 0, "no", "OFF", True, 1, "yes")],
    *[("/v1/chat/completions", {**CHAT, "n": value}) for value in (1, 64, 0, 65, True, False, 1.0, 1.5)],
    *[("/v1/chat/completions", {**CHAT, "temperature": value}) for value in (0, 2, 2.5, True, False, -1)],
    *[("/v1/chat/completions", {**CHAT, "stop": value})
      for value in ("a", "", ["a"], [""], [], ["a"] * 16, ["a"] * 17, None)],
    *[("/v1/chat/completions", {**CHAT, **fields}) for fields in (
        {"top_logprobs": 2}, {"top_logprobs": 2, "logprobs": True}, {"top_logprobs": 0}, {"top_logprobs": None},
        {"top_logprobs": 2, "logprobs": "yes"}, {"continue_final_message": True},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"continue_final_message": "true", "add_generation_prompt": "false"},
        {"chat_template_kwargs": {"enable_thinking": False}}, {"chat_template_kwargs": {"tools": []}})],
    *[("/v1/completions", {"model": "m", "prompt": value})
      for value in ("a", [1, 2], [[1], [2]], ["a"], [], [[]], [[1], []], [True], 5)],
    *[("/inference/v1/generate", {"model": "m", "token_ids": [1], "sampling_params": value})
      for value in ({"max_tokens": 3}, {"max_tokens": 0}, {"logprobs": 6}, {"stop": [""]}, {"use_beam_search": 1})],
    *[("/tokenize", fields) for fields in (
        {"prompt": "a"}, {"messages": CHAT["messages"]}, {}, {"prompt": "a", "messages": CHAT["messages"]},
        {"prompt": "a", "tools": [{}]}, {"messages": CHAT["messages"], "tools": [{}]},
        {"messages": CHAT["messages"], "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{}]}]}, {"messages": [{"role": "tool", "tool_calls": [{}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})],
    *[("/detokenize", {"tokens": value}) for value in ([0, 5], [-1], [True], ["5x"], [])],
    *[("/v1/rl/update_weights", {**RL_BASE, **fields}) for fields in (
        {"transport": {"filesystem": {"path": "/c"}}}, {},
        {"target": {"kind": "base", "op": "swap"}, "transport": {"filesystem": {"path": "/c"}}},
        {"target": {"kind": "lora", "op": "unload", "name": "a"}}, {"target": {"kind": "lora", "op": "unload"}},
        {"transport": {"filesystem": {"path": "/c"}, "nccl": {}}}, {"transport": {"filesystem": {"path": "c"}}})],
    *[("/v1/traces/rewards", {"rewards": [item]}) for item in (
        {"request_id": "r", "reward": 1}, {"session_id": "s", "advantage": 0.5}, {"request_id": "r"},
        {"request_id": "r", "session_id": "s", "reward": 1}, {"session_id": "s", "choice_index": 0, "reward": 1},
        {"request_id": "r", "choice_index": 0, "metrics": {"a": 1}}, {"reward": 1})],
]


@pytest.mark.parametrize("path, body", AGREEMENT)
def test_a_body_is_a_400_exactly_when_its_schema_refuses_it(path, body, served, document):
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    answer = served[0].post(path, json=body)
    assert (answer.status_code == 400) == (not validator(document, schema).is_valid(body)), answer.text


def test_a_token_id_is_bounded_by_the_vocabulary(served, document):
    client, tokenizer = served
    items = document["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]
    last = tokenizer.vocab_size - 1
    assert validator(document, items).is_valid(last) and not validator(document, items).is_valid(last + 1)
    assert client.post("/detokenize", json={"tokens": [last]}).status_code == 200
    assert client.post("/detokenize", json={"tokens": [last + 1]}).status_code == 400


def test_every_time_and_grouping_the_usage_query_schema_allows_is_read(document):
    parameters = {p["name"]: p["schema"] for p in document["paths"]["/v1/usage"]["get"]["parameters"]}
    assert parameters["since"]["pattern"] == parameters["until"]["pattern"]

    times, groupings = parameters["since"]["pattern"], parameters["group_by"]["items"]["pattern"]

    @settings(max_examples=500, deadline=None)
    @given(st.from_regex(whole(times)), st.from_regex(whole(groupings)))
    def read(time, grouping):
        unix_time(time)
        parse_group_by([grouping])

    read()


def whole(pattern: str) -> re.Pattern:
    """`pattern` with its closing $ as JSON Schema reads it: the end of the text (Python's $ also matches before a
    final newline)."""
    return re.compile(pattern.removesuffix("$") + r"\Z")


def resolved(document, schema: dict) -> dict:
    ref = schema.get("$ref")
    return document["components"]["schemas"][ref.removeprefix("#/components/schemas/")] if ref else schema


def validator(document, schema: dict) -> jsonschema.Draft202012Validator:
    """Validates against `schema`, whose references point into the document's components."""
    return jsonschema.Draft202012Validator({**schema, "components": document["components"]})
