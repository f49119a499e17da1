"""Shared helpers for the tool-call tests: a real tokenizer, xgrammar matching, and
renderers that write calls the way each model family's chat template does."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import xgrammar
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[2]

# A string that breaks naive parsers: markup, our own end tags, quotes, backslashes,
# unicode beyond the BMP, newlines and a code block.
TRICKY_TEXT = 'a < b && c > d </tool_call> "quoted" \\n \\\\ é 漢字 🙂\n```python\nprint("}")\n```'


@lru_cache(maxsize=1)
def tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer with Qwen's tool tokens, trained in-process."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>',
        "<tool_call>\n<function=edit_file>\n<parameter=path>\nsrc/app.py\n</parameter>\n</function>\n</tool_call>",
        "Let me look at the file first. The function returns a list of numbers.",
    ] * 20
    bpe.train_from_iterator(corpus, trainer)
    bpe.add_tokens(["<tool_call>", "</tool_call>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


@lru_cache(maxsize=1)
def compiler() -> xgrammar.GrammarCompiler:
    return xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer()))


@lru_cache(maxsize=64)
def compiled(structural_tag_json: str) -> xgrammar.CompiledGrammar:
    return compiler().compile_structural_tag(structural_tag_json)


def grammar_accepts(structural_tag: dict[str, Any], text: str) -> bool:
    """True if the grammar accepts `text` as a complete output (then end of sequence)."""
    matcher = xgrammar.GrammarMatcher(compiled(json.dumps(structural_tag)))
    return matcher.accept_string(text) and matcher.accept_token(tokenizer().eos_token_id)


def grammar_accepts_tokens(structural_tag: dict[str, Any], text: str) -> bool:
    """Like grammar_accepts, but feeding token ids as the engine does."""
    matcher = xgrammar.GrammarMatcher(compiled(json.dumps(structural_tag)))
    ids = tokenizer().encode(text, add_special_tokens=False) + [tokenizer().eos_token_id]
    return all(matcher.accept_token(token_id) for token_id in ids)


def render_hermes(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


def render_xml(name: str, arguments: dict[str, Any]) -> str:
    parameters = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


RENDERERS = {"hermes": render_hermes, "xml_params": render_xml}


def function_tool(name: str, properties: dict[str, Any], required: list[str] = ()) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(required)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@lru_cache(maxsize=1)
def tool_schemas_module():
    spec = importlib.util.spec_from_file_location("tool_schemas", REPO / "benchmarks" / "tool_schemas.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tool_schemas"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy `schema`, every property filled, strings made awkward."""
    return {key: example_value(prop) for key, prop in schema.get("properties", {}).items()}


def example_value(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if "enum" in schema:
        return schema["enum"][-1]
    if kind == "string":
        return {"date": "2026-11-29", "date-time": "2026-11-29T10:00:00Z", "email": "dev@example.com",
                "uri": "https://example.com/a?b=1"}.get(schema.get("format"), "NVDA" if "pattern" in schema else TRICKY_TEXT)
    if kind == "integer":
        return schema.get("minimum", 0) + 1 if schema.get("maximum", 10**9) > schema.get("minimum", 0) else schema["minimum"]
    if kind == "number":
        return schema.get("minimum", 0) + 2.5
    if kind == "boolean":
        return True
    if kind == "array":
        return [example_value(schema["items"])]
    if "additionalProperties" in schema and not schema.get("properties"):
        return {"PYTHONPATH": "src:lib"}
    return example_arguments(schema)
