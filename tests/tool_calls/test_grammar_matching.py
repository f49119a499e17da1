"""The grammar itself, run by xgrammar's matcher: what the model can and cannot write."""

import json

import pytest
from tool_call_helpers import RENDERERS, TRICKY_TEXT, function_tool, grammar_accepts, grammar_accepts_tokens

TOOLS = [
    function_tool("read_file", {"path": {"type": "string"}}, ["path"]),
    function_tool(
        "run_shell",
        {"command": {"type": "string"}, "timeout": {"type": "integer"}, "mode": {"type": "string", "enum": ["fg", "bg"]}},
        ["command"],
    ),
]
NAMED_SHELL = {"type": "function", "function": {"name": "run_shell"}}


@pytest.fixture
def call(fmt):
    return RENDERERS[fmt.name]


def test_auto_allows_plain_text_and_calls(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert grammar_accepts(tag, "No tool needed: 2 < 3.")
    assert grammar_accepts(tag, "Reading it.\n" + call("read_file", {"path": "a.py"}))
    two_calls = call("read_file", {"path": "a.py"}) + "\n" + call("run_shell", {"command": "ls", "timeout": 5})
    assert grammar_accepts(tag, two_calls)


def test_valid_arguments_with_awkward_strings_are_accepted(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert grammar_accepts(tag, call("run_shell", {"command": TRICKY_TEXT, "timeout": 30, "mode": "bg"}))


def test_token_by_token_acceptance(fmt, call):
    tag = fmt.structural_tag(TOOLS, "required", True)
    assert grammar_accepts_tokens(tag, call("read_file", {"path": "src/<main>.py"}))
    assert not grammar_accepts_tokens(tag, call("write_file", {"path": "x"}))


def test_undeclared_function_is_rejected(fmt, call):
    for choice in ("auto", "required"):
        assert not grammar_accepts(fmt.structural_tag(TOOLS, choice, True), call("delete_everything", {"path": "/"}))


def test_wrong_argument_type_is_rejected(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert not grammar_accepts(tag, call("run_shell", {"command": "ls", "timeout": "soon"}))
    assert not grammar_accepts(tag, call("run_shell", {"command": "ls", "mode": "daemon"}))


def test_missing_required_argument_is_rejected(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert not grammar_accepts(tag, call("run_shell", {"timeout": 5}))


def test_undeclared_argument_is_rejected(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert not grammar_accepts(tag, call("read_file", {"path": "a", "force": True}))


def test_opening_a_call_commits_to_a_valid_call(fmt):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert not grammar_accepts(tag, "I will write <tool_call> as text")


def test_whitespace_runs_are_capped(fmt, call):
    tag = fmt.structural_tag(TOOLS, "auto", True)
    text = call("run_shell", {"command": "ls", "timeout": 5})
    padded = text.replace('"timeout": 5', '"timeout":   5') if fmt.name == "hermes" else text.replace("\n5\n", "\n   5\n")
    assert padded != text
    assert not grammar_accepts(tag, padded)


def test_parallel_false_allows_one_call_only(fmt, call):
    one = call("read_file", {"path": "a.py"})
    assert grammar_accepts(fmt.structural_tag(TOOLS, "auto", False), one)
    for choice in ("auto", "required"):
        assert not grammar_accepts(fmt.structural_tag(TOOLS, choice, False), one + "\n" + one)


def test_required_starts_with_a_call(fmt, call):
    tag = fmt.structural_tag(TOOLS, "required", True)
    assert grammar_accepts(tag, call("read_file", {"path": "a.py"}))
    assert not grammar_accepts(tag, "Sure, no tools today.")
    assert not grammar_accepts(tag, "First: " + call("read_file", {"path": "a.py"}))


def test_named_allows_exactly_that_call(fmt, call):
    tag = fmt.structural_tag(TOOLS, NAMED_SHELL, True)
    shell = call("run_shell", {"command": "ls"})
    assert grammar_accepts(tag, shell)
    assert not grammar_accepts(tag, call("read_file", {"path": "a.py"}))
    assert not grammar_accepts(tag, shell + "\n" + shell)
    assert not grammar_accepts(tag, "ok " + shell)


def test_bounded_strings_may_still_hold_quotes_and_newlines(fmt, call):
    """xgrammar 0.2.8 forbids escapes in JSON strings with minLength/maxLength; the
    bounds are dropped so a commit message can have a second line."""
    tools = [function_tool("git_commit", {"message": {"type": "string", "minLength": 1, "maxLength": 72}}, ["message"])]
    tag = fmt.structural_tag(tools, "required", True)
    assert grammar_accepts(tag, call("git_commit", {"message": 'Fix "x"\n\nDetails \\ here'}))


def test_xml_zero_parameter_call_as_the_template_writes_it():
    from rollout_server.tool_calls import format_by_name

    xml = format_by_name("xml_params")
    tools = [function_tool("ping", {}), function_tool("read_file", {"path": {"type": "string"}})]
    tag = xml.structural_tag(tools, "auto", True)
    assert grammar_accepts(tag, "<tool_call>\n<function=ping>\n</function>\n</tool_call>")
    assert grammar_accepts(tag, "<tool_call>\n<function=read_file>\n</function>\n</tool_call>")  # path is optional
    compact = "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter></function>\n</tool_call>"
    assert grammar_accepts(tag, compact)
    assert xml.parse(compact, tools).tool_calls[0]["function"]["arguments"] == '{"path": "a"}'


def test_xml_a_closing_tag_inside_a_string_of_an_array_value_is_content():
    """The grammar lets a string inside an array or object value hold `</parameter>` (the tiny model wrote
    one); the parser must read it as content, whole and streamed, not as the end of the value."""
    from rollout_server.tool_calls import fold_deltas, format_by_name

    xml = format_by_name("xml_params")
    tools = [function_tool("sql_query", {"params": {"type": "array", "items": {}}, "row_limit": {"type": "integer"}},
                           ["params"])]
    params = [11, 'a</parameter>.0 "quoted" \\ </parameter>', {"k": "</parameter>"}]
    text = ("<tool_call>\n<function=sql_query>\n<parameter=params>\n" + json.dumps(params) +
            "\n</parameter>\n<parameter=row_limit>\n4\n</parameter>\n</function>\n</tool_call>")
    assert grammar_accepts(xml.structural_tag(tools, "required", True), text)
    [whole] = xml.parse(text, tools).tool_calls
    assert json.loads(whole["function"]["arguments"]) == {"params": params, "row_limit": 4}
    parser = xml.stream_parser(tools)
    deltas = [delta for char in text for delta in parser.feed(char)] + parser.finish("stop")[0]
    [streamed] = fold_deltas(deltas)[1]
    assert streamed["function"] == whole["function"]
