import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from trace_factory import make_record

from rollout_server.routes.rewards import rewards_router
from trace_pipeline.capture import TraceCapture
from trace_pipeline.settings import TraceSettings


async def team_from_header(request: Request) -> str:
    return request.headers["x-team"]


@pytest.fixture()
def served(tmp_path):
    """A running capture (nothing sealed: flush_every_s is long) and a client of the router."""
    capture = TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60))
    capture.start()
    capture.record_sync(make_record("req-a", session_id="sess-a", team="team-a"))
    capture.record_sync(make_record("req-b", session_id="sess-b", team="team-b"))
    app = FastAPI()
    app.include_router(rewards_router(capture, team_from_header))
    yield capture, TestClient(app)
    capture.close()


def post(client, team, *items):
    return client.post("/v1/traces/rewards", json={"rewards": list(items)}, headers={"x-team": team})


def test_rewards_for_own_unsealed_trace_and_session_are_stored(served):
    capture, client = served
    response = post(client, "team-a",
                    {"request_id": "req-a", "reward": 1.0, "metrics": {"pass": 1.0}},
                    {"session_id": "sess-a", "advantage": -0.5})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["object"] for d in data] == ["trace.reward"] * 2
    rows = capture.store.read_rewards("team-a")
    assert [(r.request_id, r.session_id, r.reward, r.advantage) for r in rows] == [
        ("req-a", None, 1.0, None), (None, "sess-a", None, -0.5)]


def test_reward_for_another_teams_trace_is_refused_with_an_openai_error(served):
    capture, client = served
    response = post(client, "team-a", {"request_id": "req-a", "reward": 1.0},
                    {"request_id": "req-b", "reward": 1.0})
    assert response.status_code == 403
    assert response.json() == {"error": {
        "message": "request_id 'req-b' belongs to another team", "type": "permission_error",
        "param": "rewards.1.request_id", "code": "trace_not_owned"}}
    assert capture.store.read_rewards() == [], "all or nothing: the valid item is not stored"


def test_reward_for_another_teams_session_is_refused(served):
    _, client = served
    response = post(client, "team-a", {"session_id": "sess-b", "reward": 0.0})
    assert response.status_code == 403
    assert response.json()["error"]["param"] == "rewards.0.session_id"


def test_reward_for_unknown_trace_is_not_found(served):
    _, client = served
    response = post(client, "team-a", {"request_id": "nope", "reward": 1.0})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "trace_not_found"


@pytest.mark.parametrize("item, param", [
    ({"request_id": "req-a", "session_id": "sess-a", "reward": 1.0}, "rewards.0.request_id"),
    ({"request_id": "req-a"}, "rewards.0.reward"),
    ({"request_id": "req-a", "reward": "high"}, "rewards.0.reward"),
    ({"request_id": "req-a", "reward": 1.0, "bonus": 2}, "rewards.0.bonus"),
    ({"request_id": "req-a", "reward": 1.0, "choice_index": 10**23}, "rewards.0.choice_index"),
])
def test_invalid_reward_names_the_field(served, item, param):
    _, client = served
    response = post(client, "team-a", item)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("content", [b'{"rewards": "\xff"}', b'{"rewards": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"])
def test_a_body_that_is_not_json_text_is_a_400(served, content):
    """Bytes that are not UTF-8, and nesting deeper than a parser recurses, were 500s."""
    _, client = served
    response = client.post("/v1/traces/rewards", content=content, headers={"x-team": "team-a"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("sealed", [False, True])
def test_a_reward_for_a_choice_the_request_never_had_is_not_found(tmp_path, sealed):
    capture = TraceCapture(TraceSettings(dir=tmp_path / "store", flush_every_s=60))
    capture.start()
    for choice in (0, 1):  # one request with n=2
        capture.record_sync(make_record("req-n", team="team-a", choice_index=choice))
    if sealed:
        capture.close()  # seals the WAL into Parquet
    app = FastAPI()
    app.include_router(rewards_router(capture.store if sealed else capture, team_from_header))
    client = TestClient(app)
    assert post(client, "team-a", {"request_id": "req-n", "choice_index": 1, "reward": 1.0}).status_code == 200
    response = post(client, "team-a", {"request_id": "req-n", "choice_index": 0, "reward": 1.0},
                    {"request_id": "req-n", "choice_index": 2, "reward": 1.0})
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "request 'req-n' has no choice 2; its choices: [0, 1]", "type": "invalid_request_error",
        "param": "rewards.1.choice_index", "code": "trace_not_found"}
    assert [r.choice_index for r in capture.store.read_rewards()] == [1], "all or nothing"
    capture.close()
