"""The generation routes served in front of FastAPI answer as FastAPI did, except that the key is checked first,
before the body is read and parsed, then the fields; every refusal is an OpenAI error; other requests reach the
app."""

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.generation_routes import GenerationRoute, GenerationRoutes
from rollout_server.harness.stack import create_key
from rollout_server.protocol import CompletionRequest

BODY = {"model": "tiny-qwen2", "prompt": "hi", "max_tokens": 3}


async def echo_handler_double(ctx, body: CompletionRequest, session: str | None, who):
    return JSONResponse({"team": who.team, "session": session, "max_tokens": body.max_tokens})


async def failing_handler_double(ctx, body, session, who):
    raise RuntimeError("a bug")


async def inner_app_double(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"the app: " + scope["path"].encode()})


@pytest.fixture
def served(tmp_path):
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    key = create_key(url, "team-a")
    routes = {"/v1/completions": GenerationRoute(CompletionRequest, echo_handler_double),
              "/v1/failing": GenerationRoute(CompletionRequest, failing_handler_double)}
    app = GenerationRoutes(inner_app_double, ctx=None, auth=Authenticator(KeyStore(open_database(url))),
                           max_body_bytes=1000, routes=routes)
    return TestClient(app, raise_server_exceptions=False), {"Authorization": f"Bearer {key}"}


def error_of(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_a_valid_request_reaches_its_handler_validated_with_its_caller_and_session(served):
    client, key = served
    resp = client.post("/v1/completions", json=BODY, headers={**key, "x-session-id": "s1"})
    assert resp.json() == {"team": "team-a", "session": "s1", "max_tokens": 3}


def test_the_key_is_checked_before_the_body_and_the_body_before_the_fields(served):
    client, key = served
    malformed = {"content": b'{"model": ', "headers": {"content-type": "application/json"}}
    assert error_of(client.post("/v1/completions", **malformed), 401)["code"] == "missing_api_key"
    headers = {**malformed["headers"], **key}
    assert error_of(client.post("/v1/completions", content=malformed["content"], headers=headers), 400)["code"] == "invalid_json"
    wrong = error_of(client.post("/v1/completions", json={**BODY, "max_tokens": -1}, headers=key), 400)
    assert wrong["param"] == "max_tokens"
    missing = error_of(client.post("/v1/completions", json={"prompt": "hi"}, headers=key), 400)
    assert missing["param"] == "model" and missing["code"] == "missing_required_parameter"


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_body_not_sent_as_json_is_refused_as_not_an_object(served, content_type):
    client, key = served
    headers = {**key, **({"content-type": content_type} if content_type else {})}
    error = error_of(client.post("/v1/completions", content=b'{"model": "tiny-qwen2"}', headers=headers), 400)
    assert error["message"].startswith("The request body must be a JSON object")


def test_a_json_subtype_is_read_as_json(served):
    client, key = served
    headers = {**key, "content-type": "application/vnd.api+json; charset=utf-8"}
    assert client.post("/v1/completions", content=b'{"model": "m", "prompt": "hi"}', headers=headers).status_code == 200


def test_a_body_over_the_limit_is_a_413(served):
    client, key = served
    error = error_of(client.post("/v1/completions", json={**BODY, "prompt": "x" * 2000}, headers=key), 413)
    assert "max_request_body_mib" in error["message"]


def test_a_bug_in_a_handler_is_an_openai_500_that_closes_the_connection(served):
    client, key = served
    resp = client.post("/v1/failing", json=BODY, headers=key)
    assert error_of(resp, 500)["message"] == "Internal error: RuntimeError"
    assert resp.headers["connection"] == "close"


def test_another_method_is_a_405_naming_post(served):
    client, _ = served
    resp = client.get("/v1/completions")
    assert error_of(resp, 405)["type"] == "invalid_request_error" and resp.headers["allow"] == "POST"


def test_every_other_request_goes_to_the_app_a_request_with_a_body_once_authenticated(served):
    client, key = served
    assert client.get("/v1/models").text == "the app: /v1/models"
    assert client.post("/v1/completions/", json=BODY, headers=key).text == "the app: /v1/completions/"
    assert error_of(client.post("/v1/completions/", json=BODY), 401)["code"] == "missing_api_key"
