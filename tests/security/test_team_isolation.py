"""Team isolation of the KV cache (issue #46, item 2): a team's prompts share cached KV only with its own (or its
share group's) requests, so `cached_tokens` tells no team what another sent; a session id is its team's own.

The unit tests run the front door's real serving path over a test double of the engine
(tests/security/serving_doubles.py); the stack test measures `cached_tokens` on a real stack (one vLLM worker behind
Dynamo's KV router) with real keys."""

import asyncio
import random

import httpx
import pytest

from engine.sessions import SessionPins
from rollout_server.auth import Principal
from rollout_server.completions import completions
from rollout_server.generation_routes import validated
from rollout_server.harness.stack import create_key, start_stack
from rollout_server.protocol import CompletionRequest
from rollout_server.tracing import trace_records
from tests.security.serving_doubles import MODEL, WORKER, RecordingEngineDouble, serving_context
from tests.tiny_models import untrained_tiny_model

SHARED = [["team-c", "team-d"]]


def who(team: str) -> Principal:
    return Principal(team, f"rs-{team}", is_admin=False)


@pytest.fixture(scope="module")
def model_dir():
    return untrained_tiny_model()


def serve(ctx, sends: list[tuple[str, dict, str | None]]):
    """Runs each (team, extra body fields, X-Session-ID) as a completions request; the responses, and what the
    finish hooks got."""
    finished = []

    async def hook(generation):
        finished.append(generation)

    ctx.on_finish.append(hook)

    async def run():
        responses = []
        for team, fields, session in sends:
            body = validated(CompletionRequest, {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, **fields})
            responses.append(await completions(ctx, body, session, who(team)))
            await ctx.wrapped_up()
        return responses

    return asyncio.run(run()), finished


def test_each_team_gets_a_kv_salt_of_its_own_and_a_share_group_one_salt(model_dir, tmp_path):
    engine = RecordingEngineDouble()
    ctx = serving_context(model_dir, tmp_path, engine, kv_share_groups=SHARED)
    sends = [("team-a", {}, None), ("team-a", {}, None), ("team-b", {}, None), ("team-c", {}, None),
             ("team-d", {}, None), ("team-a", {"cache_salt": "mine"}, None), ("team-b", {"cache_salt": "mine"}, None)]
    _, finished = serve(ctx, sends)
    a, a_again, b, c, d, a_salted, b_salted = [r.cache_salt for r in engine.requests]
    assert a == a_again and c == d                                    # a team, and a share group, share
    assert len({a, b, c, a_salted, b_salted}) == 5                    # nobody else does, client salt or not
    assert all("team-" not in salt for salt in (a, b, c))             # keyed: not computable from the team's name
    # What the client sees and the traces keep is the client's own salt, never the derived one
    records = [record for generation in finished for record in trace_records(generation)]
    assert finished[5].request_body["cache_salt"] == "mine"
    assert not any(salt in repr(records) for salt in (a, b, c))


def test_the_same_session_id_from_two_teams_is_two_sessions(model_dir, tmp_path):
    engine = RecordingEngineDouble()
    ctx = serving_context(model_dir, tmp_path, engine)
    responses, _ = serve(ctx, [("team-a", {}, "s1"), ("team-b", {}, "s1"), ("team-a", {}, "s1")])
    a, b, a_again = [r.session_id for r in engine.requests]
    assert a == a_again and a != b
    pins = SessionPins(ttl_s=600)  # as the in-process router pins them (engine/client/embedded_router.py)
    pins.pin(a, WORKER)
    assert pins.worker_of(a_again) == WORKER and pins.worker_of(b) is None
    assert [r.headers["x-session-id"] for r in responses] == ["s1"] * 3   # each client sees its own id


# ---- on a real stack ---------------------------------------------------------------------------

def cached_tokens(url: str, key: str, prompt: list[int]) -> int:
    response = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.stack
def test_a_teams_prompt_is_cached_for_that_team_and_its_share_group_only(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'keys.db'}"
    keys = {team: create_key(database_url, team) for team in ("team-a", "team-b", "team-c", "team-d")}
    stack = start_stack(tmp_path, workers=1, extra_args=["--database-url", database_url,
                                                         "--kv-share-groups", '[["team-c", "team-d"]]'])
    try:
        rng = random.Random(46)
        prompt_a, prompt_c = ([rng.randrange(1000, 4000) for _ in range(1000)] for _ in range(2))
        assert cached_tokens(stack.url, keys["team-a"], prompt_a) == 0
        assert cached_tokens(stack.url, keys["team-a"], prompt_a) > 0, "a team's own prompt was not cached"
        assert cached_tokens(stack.url, keys["team-b"], prompt_a) == 0, "team B hit team A's cached prompt"
        assert cached_tokens(stack.url, keys["team-c"], prompt_c) == 0
        assert cached_tokens(stack.url, keys["team-d"], prompt_c) > 0, "a share group did not share"
        assert cached_tokens(stack.url, keys["team-a"], prompt_c) == 0
    finally:
        assert stack.stop() == 0, stack.log_tail()
