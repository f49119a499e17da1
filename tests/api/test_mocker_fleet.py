"""A simulated fleet on the real stack (engine.mocker_workers): 8 of Dynamo's mocker workers in 2 processes behind
the front door's KV router. Every worker registers, the router follows their KV events (a new session lands where
its prefix is cached), and each named session stays on its worker with its prompt cached
(benchmarks/fleet_sim.py runs the same at 64 workers and 1,000 sessions)."""

import random

import httpx
import pytest

from rollout_server.harness.stack import start_stack

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    stack = start_stack(tmp_path_factory.mktemp("mocker-fleet"), workers=2, timeout_s=120,
                        extra_args=["--mocker-workers", "4"], extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false"})
    yield stack
    stack.stop()


def complete(stack, prompt: list[int], session: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(f"{stack.url}/v1/completions", json=body, headers={"X-Session-ID": session}, timeout=30)
    assert response.status_code == 200, response.text
    return response


def test_every_mocker_worker_registers(fleet):
    status = httpx.get(f"{fleet.url}/v1/status", timeout=10).json()
    assert [w["healthy"] for w in status["workers"]] == [True, True]  # one row per mocker process
    # each worker's `generate` endpoint, as Dynamo's file discovery records it (dynamo/backend/generate/<id>)
    workers = fleet.state_dir.glob("stack-*/discovery/v1/instances/dynamo%2Fbackend%2Fgenerate%2F*")
    assert len(list(workers)) == 8


def test_sessions_stay_on_their_worker_with_their_prefix_cached(fleet):
    rng = random.Random(3)
    shared = [rng.randrange(300, 4000) for _ in range(512)]
    prompts = {f"s{i}": shared + [rng.randrange(300, 4000) for _ in range(128)] for i in range(4)}
    first = {session: complete(fleet, prompt, session) for session, prompt in prompts.items()}
    for turn in range(2):
        for session, prompt in prompts.items():
            prompts[session] = prompt = prompt + [rng.randrange(300, 4000) for _ in range(32)]
            response = complete(fleet, prompt, session)
            assert response.headers["x-worker-id"] == first[session].headers["x-worker-id"]
            cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= len(prompt) - 32 - 32  # all but the new tokens and a partial block


def test_the_router_places_a_new_session_by_its_cached_prefix(fleet):
    """The mocker's KV events reach the front door's router: a new session whose prompt another session's worker
    holds goes to that worker, and finds its prefix cached there."""
    prompt = [random.Random(9).randrange(300, 4000) for _ in range(1024)]
    owner = complete(fleet, prompt, "owner").headers["x-worker-id"]
    for n in range(3):
        response = complete(fleet, prompt, f"newcomer-{n}")
        assert response.headers["x-worker-id"] == owner
        assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 992
