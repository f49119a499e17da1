"""The tiny model's build: deterministic per seed, variants differ in weights only, stale builds are rebuilt,
only assistant turns are learned (a short training run; the trained model: tests/model/)."""

import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from transformers import AutoTokenizer

from rollout_server.tiny_model.builder import REPRODUCIBLE_KERNELS, ensure_tiny_model
from rollout_server.tiny_model.training import TrainingRecipe, encode, random_conversation

# Enough to run every step of the build (tokenizer, data, training, saving) in seconds.
SHORT_TRAINING = TrainingRecipe(steps=3, rows_per_step=1, row_tokens=512, warmup_steps=1)
TOOL_FORMATS = ("hermes", "xml")


def digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_builds_are_deterministic_and_variants_differ(tmp_path):
    first = ensure_tiny_model(0, tmp_path / "a", training=SHORT_TRAINING)
    again = ensure_tiny_model(0, tmp_path / "b", training=SHORT_TRAINING)
    other = ensure_tiny_model(1, tmp_path / "a", training=SHORT_TRAINING)
    assert digest(first) == digest(again)
    assert digest(first) != digest(other)
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
    built = json.loads((first / "rollout_serve.json").read_text())
    assert built["training"]["steps"] == 3 and built["training"]["trained_tokens"] > 0
    config = json.loads((first / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["max_position_embeddings"] >= 32768
    assert config["vocab_size"] >= len(tokenizer)  # every token, added ones included, has an embedding row

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
               {"role": "tool", "tool_call_id": "c", "content": "42"}]
    text = tokenizer.apply_chat_template(history, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<tool_response>\n42\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_build_does_not_follow_the_callers_cpu_kernels(tmp_path):
    """Training's floats follow the vector kernels torch picks for the CPU (an AVX-512 machine built other
    weights than AVX2 ones); builds pin them, so a caller on other kernels gets the same weights."""
    build = ("import sys; from pathlib import Path; from rollout_server.tiny_model.builder import ensure_tiny_model; "
             "from tests.unit.test_tiny_model import SHORT_TRAINING; "
             "ensure_tiny_model(0, Path(sys.argv[1]), training=SHORT_TRAINING)")
    env = {k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_KERNELS}
    for name, kernels in (("own", {}), ("scalar", {"ATEN_CPU_CAPABILITY": "default"})):
        subprocess.run([sys.executable, "-c", build, str(tmp_path / name)], env={**env, **kernels}, check=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert digest(tmp_path / "own" / "tiny-qwen2-v0") == digest(tmp_path / "scalar" / "tiny-qwen2-v0")


def test_a_model_built_by_an_older_recipe_is_rebuilt(tmp_path):
    model = ensure_tiny_model(0, tmp_path, training=SHORT_TRAINING)
    marker = model / "rollout_serve.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "recipe": "older"}))
    assert ensure_tiny_model(0, tmp_path, training=SHORT_TRAINING) == model
    assert json.loads(marker.read_text())["recipe"] != "older"
    recipe = json.loads(marker.read_text())["recipe"]
    ensure_tiny_model(0, tmp_path, training=dataclasses.replace(SHORT_TRAINING, steps=4))  # a new training recipe
    assert json.loads(marker.read_text())["recipe"] != recipe
    assert json.loads(marker.read_text())["training"]["steps"] == 4


def test_generated_calls_fit_their_schemas_and_the_generator_is_seeded():
    first = [random_conversation(random.Random(7), max_tools=3) for _ in range(3)]
    assert first == [random_conversation(random.Random(7), max_tools=3) for _ in range(3)]
    rng = random.Random(1)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    calls = 0
    for _ in range(300):
        conversation = random_conversation(rng, max_tools=3)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in conversation.tools or []}
        for message in conversation.messages:
            for call in message.get("tool_calls") or []:
                function = call["function"]
                jsonschema.Draft202012Validator(schemas[function["name"]], format_checker=checker).validate(
                    function["arguments"])
                calls += 1
    assert calls > 200


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_only_assistant_turns_are_learned(tmp_path, tool_format):
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(0, tmp_path, tool_format, SHORT_TRAINING))
    rng = random.Random(3)
    conversation = next(c for c in (random_conversation(rng, 2) for _ in range(50))
                        if any(m.get("tool_calls") for m in c.messages))
    ids, learned = encode(conversation, tokenizer)
    text = tokenizer.apply_chat_template(conversation.messages, tools=conversation.tools, tokenize=False)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # the prompt's own tokenization
    learned_text = tokenizer.decode([t for t, keep in zip(ids, learned) if keep])
    turns = text.split("<|im_start|>assistant\n")[1:]
    assert learned_text == "".join(turn[:turn.index("<|im_end|>") + len("<|im_end|>")] for turn in turns)
