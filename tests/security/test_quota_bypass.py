"""Quotas that cannot be skipped (issue #46, item 6): a batch line counts against the rate limits of the key that
created its batch, and waits (never fails) while that key is over them; a client-chosen request id is its team's
own, so it can never close another request's quota reservation, and one already running for the team is refused.

The front door's real serving path (handlers, Generation, TeamScope, RateLimiter, BatchStore, BatchRunner) over a
test double of the engine (tests/security/serving_doubles.py)."""

import asyncio
import json

import pytest

from rollout_server.app import internal_execute
from rollout_server.auth import Principal
from rollout_server.batch_runner import BatchRunner
from rollout_server.batches import BatchStore, open_batch_database
from rollout_server.errors import APIError
from rollout_server.generate import generate
from rollout_server.generation_routes import validated
from rollout_server.protocol import GenerateRequest
from rollout_server.quotas import KeyLimits
from rollout_server.routes.batches import batches_router
from tests.security.serving_doubles import MODEL, RecordingEngineDouble, limiter_for, serving_context, until
from tests.tiny_models import untrained_tiny_model
from tests.usage.support import ManualClock, as_team, client_for, principal_from_test_header

TEAM_A = Principal("team-a", "rs-a-1", is_admin=False)
TEAM_A_OTHER_KEY = Principal("team-a", "rs-a-2", is_admin=False)
TEAM_B = Principal("team-b", "rs-b-1", is_admin=False)


@pytest.fixture(scope="module")
def model_dir():
    return untrained_tiny_model()


def generate_request(request_id: str) -> GenerateRequest:
    return validated(GenerateRequest, {"model": MODEL, "token_ids": [5, 6, 7], "request_id": request_id,
                                       "sampling_params": {"max_tokens": 2}})


# ---- batch lines -----------------------------------------------------------------------------

def test_batch_lines_wait_for_their_keys_rate_limit_and_never_fail_for_it(model_dir, tmp_path):
    clock = ManualClock()
    limiter = limiter_for(KeyLimits(requests_per_min=60, tokens_per_min=None), clock)
    engine = RecordingEngineDouble()
    ctx = serving_context(model_dir, tmp_path, engine, limiter)
    store = BatchStore(open_batch_database(f"sqlite:///{tmp_path / 'batches.db'}"), tmp_path / "batches")
    api = client_for(batches_router(store, principal_from_test_header))  # team-a's key is rs-team-a
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2}} for i in range(2)]
    uploaded = api.post("/v1/files", files={"file": ("in.jsonl", "\n".join(map(json.dumps, lines)).encode())},
                        data={"purpose": "batch"}, headers=as_team("team-a")).json()
    batch = api.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/completions",
                                          "completion_window": "24h"}, headers=as_team("team-a")).json()

    async def scenario() -> tuple[dict, dict]:
        for i in range(60):  # the key's interactive requests used up its minute
            await limiter.admit("rs-team-a", f"interactive-{i}", 1)
        runner = BatchRunner(store, internal_execute(ctx), poll_s=0.02, yield_sleep_s=0.02)
        await runner.start()
        try:
            await asyncio.sleep(1.0)
            while_over = await asyncio.to_thread(store.get_batch, batch["id"], "team-a")
            assert engine.requests == [], "a batch line ran while its key was over its rate limit"
            clock.advance(2.0)  # room for two requests
            await until(lambda: store.get_batch(batch["id"], "team-a")["status"] == "completed")
            return while_over, await asyncio.to_thread(store.get_batch, batch["id"], "team-a")
        finally:
            await runner.stop()

    while_over, final = asyncio.run(scenario())
    assert while_over["status"] == "in_progress"
    assert while_over["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert len(engine.requests) == 2
    # The lines ran as their team: its KV salt, as its interactive requests have
    assert {r.cache_salt for r in engine.requests} == {ctx.teams.cache_salt("team-a", None)}


# ---- request ids -----------------------------------------------------------------------------

def test_a_request_id_running_for_the_team_is_refused_and_the_running_request_keeps_its_reservation(
        model_dir, tmp_path):
    limiter = limiter_for(KeyLimits(requests_per_min=None, tokens_per_min=1000))
    engine = RecordingEngineDouble(hold=True)
    ctx = serving_context(model_dir, tmp_path, engine, limiter)

    async def scenario():
        first = asyncio.create_task(generate(ctx, generate_request("r1"), None, TEAM_A))
        await until(lambda: len(engine.requests) == 1)
        with pytest.raises(APIError) as refused:  # the same team, through another of its keys
            await asyncio.wait_for(generate(ctx, generate_request("r1"), None, TEAM_A_OTHER_KEY), 5)
        assert (limiter.open_reservations, len(engine.requests)) == (1, 1)
        engine.gates[0].set()
        answered = await first
        await ctx.wrapped_up()
        again = asyncio.create_task(generate(ctx, generate_request("r1"), None, TEAM_A))  # over: the id is free
        await until(lambda: len(engine.requests) == 2)
        engine.gates[1].set()
        again = await asyncio.wait_for(again, 5)
        await ctx.wrapped_up()
        return refused.value, answered, again

    refused, answered, again = asyncio.run(scenario())
    assert (refused.status, refused.param, refused.code) == (409, "request_id", "request_id_in_use")
    assert answered.status_code == 200 and again.status_code == 200
    assert json.loads(answered.body)["request_id"] == "r1" and answered.headers["x-request-id"] == "r1"
    assert limiter.open_reservations == 0


def test_another_teams_request_under_the_same_id_never_touches_the_running_requests_reservation(
        model_dir, tmp_path):
    limiter = limiter_for(KeyLimits(requests_per_min=None, tokens_per_min=1000))
    engine = RecordingEngineDouble(hold=True)
    ctx = serving_context(model_dir, tmp_path, engine, limiter)

    async def scenario():
        team_a = asyncio.create_task(generate(ctx, generate_request("r1"), None, TEAM_A))
        await until(lambda: len(engine.requests) == 1)
        team_b = asyncio.create_task(generate(ctx, generate_request("r1"), None, TEAM_B))
        await until(lambda: len(engine.requests) == 2)
        engine.gates[1].set()
        b_answer = await asyncio.wait_for(team_b, 5)
        await ctx.wrapped_up()
        open_after_b = limiter.open_reservations
        engine.gates[0].set()
        a_answer = await team_a
        await ctx.wrapped_up()
        return a_answer, b_answer, open_after_b

    a_answer, b_answer, open_after_b = asyncio.run(scenario())
    assert open_after_b == 1, "team B's request closed team A's reservation"
    assert limiter.open_reservations == 0
    assert [json.loads(r.body)["request_id"] for r in (a_answer, b_answer)] == ["r1", "r1"]
    assert engine.requests[0].request_id != engine.requests[1].request_id
