"""The tiny model: deterministic per seed, variants differ in weights only, stale builds are rebuilt."""

import hashlib
import json

from transformers import AutoTokenizer

from rollout_server.tiny_model import ensure_tiny_model


def digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_builds_are_deterministic_and_variants_differ(tmp_path):
    first = ensure_tiny_model(0, tmp_path / "a")
    again = ensure_tiny_model(0, tmp_path / "b")
    other = ensure_tiny_model(1, tmp_path / "a")
    assert digest(first) == digest(again)
    assert digest(first) != digest(other)
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
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


def test_a_model_built_by_an_older_recipe_is_rebuilt(tmp_path):
    model = ensure_tiny_model(0, tmp_path)
    marker = model / "rollout_serve.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "recipe": "older"}))
    assert ensure_tiny_model(0, tmp_path) == model
    assert json.loads(marker.read_text())["recipe"] != "older"
