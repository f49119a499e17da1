"""Token-in/token-out (verifiers' train mode) and KV-sticky sessions over two workers."""

import math
import random

import httpx
import pytest
from transformers import AutoTokenizer

from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"


@pytest.fixture(scope="module")
def tokenizer(stack):
    return AutoTokenizer.from_pretrained(trained_tiny_model())


def verifiers_generate(url: str, token_ids: list[int], max_tokens: int, session: str) -> dict:
    """What verifiers 0.4's train-mode client sends and checks."""
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["max_model_len"] > len(token_ids)
    body = {"model": MODEL, "token_ids": token_ids,
            "sampling_params": {"temperature": 1.0, "max_tokens": max_tokens, "stop_token_ids": [2], "logprobs": 1,
                                "skip_special_tokens": False, "seed": 11}}
    resp = httpx.post(f"{url}/inference/v1/generate", json=body, headers={"X-Session-ID": session}, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"])
    for token_id, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
        assert entry["token"] == f"token_id:{token_id}"
        assert math.isfinite(entry["logprob"])
    assert choice["finish_reason"] in ("length", "stop")
    assert out["prompt_token_ids"] == token_ids
    assert resp.headers["x-policy-version"] == "0"
    return out


def test_train_mode_round_trip_keeps_exact_token_ids(stack, tokenizer):
    messages = [{"role": "user", "content": "solve the task"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    first = verifiers_generate(stack.url, prompt, 10, "tito-1")
    completion = first["choices"][0]["token_ids"]
    # The next turn extends prompt + completion exactly: no re-tokenization drift.
    follow_up = tokenizer.encode("<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")
    second = verifiers_generate(stack.url, prompt + completion + follow_up, 10, "tito-1")
    assert second["prompt_token_ids"][:len(prompt) + len(completion)] == prompt + completion
    # Greedy is reproducible token for token on the completions route too.
    greedy = httpx.post(f"{stack.url}/inference/v1/generate", timeout=60, json={
        "model": MODEL, "token_ids": prompt, "sampling_params": {"temperature": 0, "max_tokens": 6, "logprobs": 0}}).json()
    again = httpx.post(f"{stack.url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 6, "return_token_ids": True}).json()
    assert greedy["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]


def _metric(stack, name: str) -> float:
    line = next(line for line in httpx.get(f"{stack.url}/metrics", timeout=10).text.splitlines()
                if line.startswith(name + " "))
    return float(line.split()[1])


def test_long_session_stays_on_one_worker_with_growing_cache_hits(stack, client, tokenizer):
    """Also: the front door tokenizes each returning turn from where the turn before ended (its ids kept),
    and the ids are exactly those of the whole prompt tokenized by Hugging Face."""
    rng = random.Random(5)
    vocabulary = "read write file path edit search shell test model token cache worker session".split()
    messages = [{"role": "system", "content": " ".join(rng.choice(vocabulary) for _ in range(2500))}]
    workers, cached, prompts = [], [], []
    reused_before = _metric(stack, "rollout_session_prompt_tokens_reused")
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: " + " ".join(rng.choice(vocabulary) for _ in range(400))})
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0, extra_headers={"X-Session-ID": "agent-42"},
            extra_body={"return_token_ids": True})
        reply = raw.parse()
        workers.append(raw.headers["x-worker-id"])
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        prompts.append(reply.usage.prompt_tokens)
        assert raw.headers["x-session-id"] == "agent-42"
        assert reply.model_extra["prompt_token_ids"] == tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    # Each returning turn reused the ids of the turn before, all but its "<|im_start|>assistant\n" tail.
    assert _metric(stack, "rollout_session_prompt_tokens_reused") - reused_before >= sum(prompts[:3]) - 3 * 8
    assert len(set(workers)) == 1, workers
    assert prompts[0] > 2500
    for turn in range(1, 4):
        assert cached[turn] > cached[turn - 1]
        # Everything up to the previous turn's prompt is reused (minus the partial last block).
        assert cached[turn] >= prompts[turn - 1] - 32
    status = stack.status()
    assert {w["instance_id"] for w in status["workers"]} >= set(workers)


def test_concurrent_sessions_spread_over_both_workers(stack, client):
    import concurrent.futures

    def turn(i):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"session {i} " + "lorem " * (200 + 37 * i)}],
            max_tokens=24, temperature=0, extra_headers={"X-Session-ID": f"spread-{i}"})
        return raw.headers["x-worker-id"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        workers = set(pool.map(turn, range(8)))
    assert len(workers) == 2, "Dynamo's router should use both workers under concurrent load"
