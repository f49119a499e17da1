"""The structural tag for each tool_choice, checked by xgrammar's compiler and by vLLM's
own request models (the exact body fragment the front door sends)."""

import json

import pytest
import xgrammar
from tool_call_helpers import compiler, function_tool

from rollout_server.tool_calls import GrammarCache, vllm_body_fragment

TOOLS = [
    function_tool("read_file", {"path": {"type": "string"}}, ["path"]),
    function_tool("run_shell", {"command": {"type": "string"}, "timeout": {"type": "integer"}}, ["command"]),
]
NAMED_SHELL = {"type": "function", "function": {"name": "run_shell"}}


def test_none_means_no_constraint(fmt):
    assert fmt.structural_tag(TOOLS, "none", True) is None


def test_no_tools_means_no_constraint(fmt):
    assert fmt.structural_tag(None, "auto", True) is None


@pytest.mark.parametrize("parallel", [True, False, None])
def test_auto_is_triggered_and_optional(fmt, parallel):
    tag_format = fmt.structural_tag(TOOLS, "auto", parallel)["format"]
    assert tag_format["type"] == "triggered_tags"
    assert tag_format["triggers"] == ["<tool_call>"]
    assert tag_format["at_least_one"] is False
    assert tag_format["stop_after_first"] is (parallel is False)
    assert len(tag_format["tags"]) == 2


@pytest.mark.parametrize("parallel", [True, False])
def test_required_needs_one_call(fmt, parallel):
    tag_format = fmt.structural_tag(TOOLS, "required", parallel)["format"]
    assert tag_format["at_least_one"] is True
    assert tag_format["stop_after_first"] is (not parallel)


def test_named_is_a_single_tag_for_that_tool(fmt):
    tag_format = fmt.structural_tag(TOOLS, NAMED_SHELL, True)["format"]
    assert tag_format["type"] == "tag"
    assert "run_shell" in tag_format["begin"] and tag_format["begin"].startswith("<tool_call>")


def test_arguments_whitespace_is_capped(fmt):
    for tag in fmt.structural_tag(TOOLS, "auto", True)["format"]["tags"]:
        assert tag["content"]["type"] == "json_schema"
        assert tag["content"]["max_whitespace_cnt"] == 1


def test_hermes_and_xml_tags_look_like_their_templates():
    from rollout_server.tool_calls import format_by_name

    hermes = format_by_name("hermes").structural_tag(TOOLS, NAMED_SHELL, True)["format"]
    assert (hermes["begin"], hermes["end"]) == ('<tool_call>\n{"name": "run_shell", "arguments": ', "}\n</tool_call>")
    xml = format_by_name("xml_params").structural_tag(TOOLS, NAMED_SHELL, True)["format"]
    assert (xml["begin"], xml["end"]) == ("<tool_call>\n<function=run_shell>\n", "</function>\n</tool_call>")
    assert xml["content"]["style"] == "qwen_xml"


@pytest.mark.parametrize("choice", ["auto", "required", NAMED_SHELL])
@pytest.mark.parametrize("parallel", [True, False])
def test_every_mode_compiles_with_xgrammar(fmt, choice, parallel):
    tag_json = json.dumps(fmt.structural_tag(TOOLS, choice, parallel))
    xgrammar.StructuralTag.from_json(tag_json)  # the pydantic model xgrammar documents
    assert compiler().compile_structural_tag(tag_json).memory_size_bytes > 0


def test_the_body_fragment_is_what_vllm_032_accepts(fmt):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tag_json = json.dumps(fmt.structural_tag(TOOLS, "required", False))
    fragment = vllm_body_fragment(tag_json)
    assert fragment == {"structured_outputs": {"structural_tag": tag_json}}
    # Chat: tools still rendered by the template, but tool_choice "none" so vLLM (which
    # has no tool parser in our stack) neither rejects nor re-parses the request.
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "none", **fragment}
    )
    assert chat.to_sampling_params(16, {}).structured_outputs.structural_tag == tag_json
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fragment})
    assert completion.to_sampling_params(16, {}).structured_outputs.structural_tag == tag_json


def test_vllm_rejects_a_broken_tag():
    """The same vLLM validation path says no to a tag xgrammar cannot read."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError

    broken = json.dumps({"type": "structural_tag", "format": {"type": "tag", "begin": "<a>"}})
    with pytest.raises(VLLMValidationError, match="structural_tag"):
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", **vllm_body_fragment(broken)})


def test_cache_returns_the_fragment_for_the_request(fmt):
    import asyncio

    fragment = asyncio.run(GrammarCache().get(TOOLS, "auto", None, fmt))
    assert json.loads(fragment["structured_outputs"]["structural_tag"]) == fmt.structural_tag(TOOLS, "auto", None)
    assert asyncio.run(GrammarCache().get(TOOLS, "none", None, fmt)) == {}


def test_length_bounds_are_dropped_from_json_arguments_only():
    from rollout_server.tool_calls import format_by_name
    from rollout_server.tool_calls.schema_keywords import grammar_schema

    schema = {
        "type": "object",
        "properties": {
            "minLength": {"type": "string", "minLength": 1},  # a property that happens to be called minLength
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}},
            "either": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
        },
        "required": ["minLength"],
    }
    assert grammar_schema(schema, json_strings=True) == {
        "type": "object",
        "properties": {
            "minLength": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["minLength"],
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    named = {"type": "function", "function": {"name": "f"}}
    assert format_by_name("xml_params").structural_tag(tools, named, True)["format"]["content"]["json_schema"] == schema
