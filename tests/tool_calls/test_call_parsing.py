"""Whole outputs parsed into OpenAI content + tool_calls, byte for byte."""

import json

import pytest
from tool_call_helpers import RENDERERS, TRICKY_TEXT, function_tool

from rollout_server.tool_calls import format_by_name

TOOLS = [
    function_tool("read_file", {"path": {"type": "string"}}, ["path"]),
    function_tool(
        "run_shell",
        {"command": {"type": "string"}, "timeout": {"type": "integer"}, "env": {"type": "object"},
         "args": {"type": "array", "items": {"type": "string"}}},
        ["command"],
    ),
    function_tool("ping", {}),
]


@pytest.fixture
def call(fmt):
    return RENDERERS[fmt.name]


def test_plain_text_is_content_unchanged(fmt):
    text = "No tools needed.\n```html\n<tool_call-ish> </tool_call> \\n é\n```\n"
    parsed = fmt.parse(text, TOOLS)
    assert (parsed.content, parsed.tool_calls) == (text, [])
    assert not parsed.cut_call and not parsed.malformed_call


def test_one_call_with_content_before(fmt, call):
    parsed = fmt.parse("Let me read it.\n" + call("read_file", {"path": "src/app.py"}), TOOLS)
    assert parsed.content == "Let me read it."
    [tool_call] = parsed.tool_calls
    assert tool_call["type"] == "function" and tool_call["id"].startswith("call_")
    assert tool_call["function"]["name"] == "read_file"
    assert json.loads(tool_call["function"]["arguments"]) == {"path": "src/app.py"}


def test_call_only_has_no_content(fmt, call):
    parsed = fmt.parse(call("ping", {}), TOOLS)
    assert parsed.content is None
    assert parsed.tool_calls[0]["function"] == {"name": "ping", "arguments": "{}"}


def test_parallel_calls_get_distinct_ids_in_order(fmt, call):
    text = call("read_file", {"path": "a"}) + "\n" + call("read_file", {"path": "b"}) + "\n" + call("ping", {})
    parsed = fmt.parse(text, TOOLS)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["read_file", "read_file", "ping"]
    assert len({c["id"] for c in parsed.tool_calls}) == 3
    assert parsed.content is None


def test_content_between_and_after_calls_is_kept(fmt, call):
    text = "First.\n" + call("read_file", {"path": "a"}) + "\nThen <b>bold</b>.\n" + call("ping", {}) + "\n"
    assert fmt.parse(text, TOOLS).content == "First.\n\nThen <b>bold</b>."


@pytest.mark.parametrize("value", [TRICKY_TEXT, "", " leading and trailing ", "\nstarts with a newline\n\n", "\\", "</tool_call>"])
def test_awkward_string_arguments_round_trip(fmt, call, value):
    arguments = {"command": value, "timeout": 30, "env": {"A": "1"}, "args": ["-l", value]}
    parsed = fmt.parse(call("run_shell", arguments), TOOLS)
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == arguments


def test_hermes_arguments_are_the_models_bytes():
    raw_arguments = '{"command":"echo \\u00e9 \\"hi\\" </tool_call>","timeout": 5}'
    text = f'<tool_call>\n{{"name": "run_shell", "arguments": {raw_arguments}}}\n</tool_call>'
    parsed = format_by_name("hermes").parse(text, TOOLS)
    assert parsed.tool_calls[0]["function"]["arguments"] == raw_arguments


def test_xml_string_values_are_json_quoted_and_others_copied():
    text = (
        "<tool_call>\n<function=run_shell>\n<parameter=command>\n42\n</parameter>\n"
        '<parameter=timeout>\n42\n</parameter>\n<parameter=args>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>'
    )
    arguments = format_by_name("xml_params").parse(text, TOOLS).tool_calls[0]["function"]["arguments"]
    assert arguments == '{"command": "42", "timeout": 42, "args": ["a", "b"]}'


def test_cut_inside_arguments_is_flagged(fmt, call):
    text = "Checking.\n" + call("run_shell", {"command": "ls -la", "timeout": 5})
    parsed = fmt.parse(text[: text.index("ls -la") + 3], TOOLS)
    assert parsed.cut_call
    assert parsed.content == "Checking."
    assert parsed.tool_calls[0]["function"]["name"] == "run_shell"
    with pytest.raises(json.JSONDecodeError):
        json.loads(parsed.tool_calls[0]["function"]["arguments"])


def test_cut_before_the_name_is_complete_is_flagged_and_not_content(fmt, call):
    text = "Checking.\n" + call("run_shell", {"command": "ls"})
    parsed = fmt.parse(text[: text.index("run_sh")], TOOLS)
    assert parsed.cut_call and parsed.tool_calls == []
    assert "<tool_call>" not in (parsed.content or "")


def test_cut_inside_the_end_tag_is_flagged(fmt, call):
    text = call("read_file", {"path": "a"})
    assert fmt.parse(text[:-3], TOOLS).cut_call
    assert not fmt.parse(text, TOOLS).cut_call


def test_partial_marker_at_the_end_is_content(fmt):
    parsed = fmt.parse("Almost <tool_", TOOLS)
    assert (parsed.content, parsed.cut_call) == ("Almost <tool_", False)


@pytest.mark.parametrize(
    "body",
    ["not a call at all</tool_call>", '\n{"arguments": {}, "name": "ping"}\n</tool_call>', "\n<function>\n</tool_call>"],
)
def test_malformed_call_keeps_its_text_as_content_and_is_flagged(fmt, body):
    text = "Before. <tool_call>" + body + " after"
    parsed = fmt.parse(text, TOOLS)
    assert parsed.malformed_call
    assert parsed.content == text


def test_hermes_invalid_arguments_json_is_flagged():
    text = '<tool_call>\n{"name": "ping", "arguments": {"a": tru}}\n</tool_call>'
    assert format_by_name("hermes").parse(text, TOOLS).malformed_call


def test_xml_without_tool_schemas_reads_json_values_and_keeps_the_rest_as_strings():
    text = (
        "<tool_call>\n<function=run_shell>\n<parameter=command>\nls -la\n</parameter>\n"
        "<parameter=timeout>\n42\n</parameter>\n</function>\n</tool_call>"
    )
    arguments = format_by_name("xml_params").parse(text).tool_calls[0]["function"]["arguments"]
    assert json.loads(arguments) == {"command": "ls -la", "timeout": 42}
