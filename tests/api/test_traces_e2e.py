"""What was served comes back from `rollout-serve traces export` exactly: token ids, logprobs, rewards."""

import subprocess
import sys
import time

import datasets
import httpx
import pytest
from transformers import AutoTokenizer

from rollout_server.harness.stack import REPO
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,10}$"}},
    "required": ["city"], "additionalProperties": False}}}


def export(stack, tmp_path, fmt: str, session: str | None, expect_rows: int | None = None,
           timeout_s: float = 60.0, until=None):
    """Exports one session (None: all of them) until `expect_rows` rows appear, or until `until(rows)` holds
    (records are sealed every second)."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        out = tmp_path / f"{fmt}-{session}-{attempt}"
        done = subprocess.run([sys.executable, "-m", "rollout_server.cli", "traces", "export", "--format", fmt,
                               "--out", str(out), "--team", "local", "--no-progress",
                               "--store", str(stack.state_dir / "traces"), *(["--session", session] if session else [])],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        rows = list(datasets.load_dataset("parquet", data_dir=str(out), split="train")) if any(out.glob("*.parquet")) else []
        complete = until(rows) if until else len(rows) >= expect_rows
        if complete or time.monotonic() > deadline:
            if expect_rows is not None:
                assert len(rows) == expect_rows, rows
            return rows
        attempt += 1
        time.sleep(1.0)


@pytest.fixture(scope="module")
def tokenizer(stack):
    return AutoTokenizer.from_pretrained(trained_tiny_model())


def generate(stack, token_ids, session):
    body = {"model": MODEL, "token_ids": token_ids, "sampling_params": {"max_tokens": 6, "temperature": 1.0, "seed": 3}}
    resp = httpx.post(f"{stack.url}/inference/v1/generate", json=body, headers={"X-Session-ID": session}, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_token_in_token_out_session_exports_as_one_rl_trajectory_with_rewards(stack, tokenizer, tmp_path):
    session = "tito-trace-1"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "solve"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    first = generate(stack, prompt, session)
    turn1 = first["choices"][0]
    follow = tokenizer.encode("<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    second = generate(stack, prompt + turn1["token_ids"] + follow, session)
    turn2 = second["choices"][0]

    rewarded = httpx.post(f"{stack.url}/v1/traces/rewards", timeout=30,
                          json={"rewards": [{"session_id": session, "reward": 1.5, "advantage": 0.25}]})
    assert rewarded.status_code == 200, rewarded.text

    [row] = export(stack, tmp_path, "rl", session, expect_rows=1)
    expected_ids = prompt + turn1["token_ids"] + follow + turn2["token_ids"]
    assert row["token_ids"] == expected_ids
    assert row["mask"] == [0] * len(prompt) + [1] * len(turn1["token_ids"]) + [0] * len(follow) + [1] * len(turn2["token_ids"])
    sampled = [e["logprob"] for e in turn1["logprobs"]["content"]] + [e["logprob"] for e in turn2["logprobs"]["content"]]
    assert [lp for lp, m in zip(row["logprobs"], row["mask"]) if m] == pytest.approx(sampled, abs=1e-6)
    assert row["reward"] == 1.5 and row["advantage"] == 0.25
    assert row["policy_version"] == 0 and row["session_id"] == session


def test_chat_session_with_tools_exports_exact_ids_logprobs_and_messages(stack, client, tmp_path):
    session = "chat-trace-1"
    messages = [{"role": "user", "content": "weather in paris?"}]
    replies = []
    for turn in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
            max_tokens=200, temperature=0, logprobs=True, extra_body={"return_token_ids": True},
            extra_headers={"X-Session-ID": session})
        reply = raw.parse()
        replies.append(reply)
        call = reply.choices[0].message.tool_calls[0]
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]

    raw_rows = sorted(export(stack, tmp_path, "raw", session, expect_rows=2), key=lambda r: r["created_at"])
    for row, reply in zip(raw_rows, replies):
        choice = reply.choices[0]
        assert row["request_id"] == reply.id
        assert row["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
        assert row["completion_token_ids"] == choice.model_extra["token_ids"]
        assert row["completion_logprobs"] == pytest.approx([e.logprob for e in choice.logprobs.content], abs=1e-6)
        assert row["finish_reason"] == "tool_calls"
        assert row["worker_ids"] == [reply.model_extra["worker_id"]]

    # Turn 2's prompt holds turn 1's prompt and answer token for token (the chat template re-renders the
    # compact call exactly), so the two turns stitch into one trajectory: one SFT row, the whole conversation.
    # Greedy answers: a temperature-1 sample may split what the tokenizer merges ('"' + ':' for '":'); the
    # re-rendered history then differs token for token, and such turns export as separate rows.
    first_turn = replies[0].model_extra["prompt_token_ids"] + replies[0].choices[0].model_extra["token_ids"]
    assert replies[1].model_extra["prompt_token_ids"][:len(first_turn)] == first_turn
    [row] = export(stack, tmp_path, "sft", session, expect_rows=1)
    assert row["request_id"] == replies[1].id
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    for message, reply in zip(row["messages"][1::2], replies):
        call = reply.choices[0].message.tool_calls[0]
        assert message["tool_calls"][0]["id"] == call.id
        assert message["tool_calls"][0]["function"]["arguments"] == call.function.arguments


def test_rewards_for_unknown_traces_are_refused(stack):
    resp = httpx.post(f"{stack.url}/v1/traces/rewards", json={"rewards": [{"request_id": "no-such", "reward": 1}]},
                      timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "rewards.0.request_id"


def test_logprobs_are_captured_also_when_the_client_does_not_ask_for_them(stack, client, tmp_path):
    """traces.capture_logprobs (on by default): the engine computes every sampled token's logprob for the trace."""
    args = dict(model=MODEL, prompt="capture what was not asked", max_tokens=12, temperature=0,
                extra_body={"return_token_ids": True, "ignore_eos": True})
    plain = client.completions.create(**args, extra_headers={"X-Session-ID": "capture-unasked"})
    asked = client.completions.create(**args, logprobs=0)
    assert plain.choices[0].logprobs is None
    [row] = export(stack, tmp_path, "raw", "capture-unasked", expect_rows=1)
    assert row["completion_token_ids"] == plain.choices[0].model_extra["token_ids"]
    assert row["completion_logprobs"] == pytest.approx(asked.choices[0].logprobs.token_logprobs, abs=1e-4)
