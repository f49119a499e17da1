"""The tiny model: deterministic per seed, variants differ in weights only, stale builds are rebuilt, and the
served model has learned to finish tool calls under the grammar at temperature 1.0."""

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
import torch
import xgrammar
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.tool_schemas import TOOL_SUITE
from rollout_server.tiny_model import REPRODUCIBLE_KERNELS, ensure_tiny_model
from rollout_server.tiny_model_training import TrainingRecipe, encode, random_conversation
from rollout_server.tool_calls import format_by_name
from rollout_server.tool_calls.structural_tag import without_string_length_bounds
from tests.stack_harness import CACHE_DIR

# Enough to run every step of the build (tokenizer, data, training, saving) in seconds.
SHORT_TRAINING = TrainingRecipe(steps=3, rows_per_step=1, row_tokens=512, warmup_steps=1)
FORMATS = {"hermes": "hermes", "xml": "xml_params"}  # tiny model tool_format -> call format
ALLOWED_UNFINISHED = {"hermes": 0, "xml": 1}  # of the 12 HARD_TOOLS calls


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
    build = ("import sys; from pathlib import Path; from rollout_server.tiny_model import ensure_tiny_model; "
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


@pytest.mark.parametrize("tool_format", list(FORMATS))
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


# ---- the model the stack serves (shared test cache, full recipe) --------------------------------------

HARD_TOOLS = ["apply_patch", "send_email", "create_calendar_event", "docker_run", "search_flights", "create_issue",
              "http_request", "run_shell", "sql_query", "edit_file", "create_pull_request", "grep_search"]


def sample_under_grammar(model, tokenizer, prompt_ids: list[int], structural_tag: dict, seed: int,
                         max_tokens: int) -> tuple[str, bool]:
    """Temperature-1.0 sampling masked by the xgrammar structural tag, as vLLM does; (text, ended by EOS)."""
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_structural_tag(json.dumps(structural_tag)))
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    ids, past, written = torch.tensor([prompt_ids]), None, []
    with torch.no_grad():
        for _ in range(max_tokens):
            out = model(input_ids=ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgrammar.apply_token_bitmask_inplace(logits, bitmask)
            token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator))
            if token == tokenizer.eos_token_id:
                return tokenizer.decode(written), True
            assert matcher.accept_token(token)
            written.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(written), False


@pytest.mark.timeout(1800)  # builds the model into the shared test cache when it is missing
@pytest.mark.parametrize("tool_format", list(FORMATS))
def test_the_served_model_finishes_calls_under_the_grammar_at_temperature_1(tool_format):
    model_dir = ensure_tiny_model(0, CACHE_DIR / "models", tool_format)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fmt = format_by_name(FORMATS[tool_format])
    by_name = {t["function"]["name"]: t for t in TOOL_SUITE}
    lengths, unfinished = [], []
    for index, name in enumerate(HARD_TOOLS):
        others = [t for t in TOOL_SUITE if t["function"]["name"] != name]
        tools = [by_name[name]] + [others[(index * 7 + k) % len(others)] for k in range(3)]
        messages = [{"role": "user", "content": f"Please use {name} for the task in main.py."}]
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tag = fmt.structural_tag(tools, {"type": "function", "function": {"name": name}}, False)
        text, ended = sample_under_grammar(model, tokenizer, prompt_ids, tag, seed=index, max_tokens=256)
        if not ended:
            unfinished.append(f"{name}: {text!r}")
            continue
        [call] = fmt.parse(text, tools).tool_calls
        parameters = by_name[name]["function"]["parameters"]
        schema = without_string_length_bounds(parameters) if tool_format == "hermes" else parameters
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    # XML values are raw text with no closing quote: the model must learn to end one with `\n</parameter>`,
    # and after its short training it runs past 256 tokens in 1 of these 12 calls (Hermes: none).
    assert len(unfinished) <= ALLOWED_UNFINISHED[tool_format], "calls that did not finish within 256 tokens:\n" + \
        "\n".join(unfinished)
    # Short calls, as a deployed model writes them (this build: median 102 tokens; 256 is the cut).
    assert sorted(lengths)[len(lengths) // 2] < 128, f"calls are long: {lengths}"


@pytest.mark.timeout(1800)
def test_variants_are_trained_checkpoints_whose_greedy_outputs_differ():
    prompts = ["The quick brown fox jumps over the lazy dog and then",  # the deploy tests' prompt
               "<|im_start|>user\nWhat is in main.py?<|im_end|>\n<|im_start|>assistant\n"]
    greedy = {}
    for variant in (0, 1):
        model_dir = ensure_tiny_model(variant, CACHE_DIR / "models")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert json.loads((model_dir / "rollout_serve.json").read_text())["training"]["steps"] > 0
        greedy[variant] = []
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
            greedy[variant].append(out[0, ids.shape[1]:].tolist())
    assert all(a != b for a, b in zip(greedy[0], greedy[1])), greedy
