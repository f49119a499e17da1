"""Required mode admits calls only; XML values lose exactly one formatting whitespace character per side."""

from tool_call_helpers import function_tool, grammar_accepts, render_hermes

from rollout_server.tool_calls import format_by_name

TOOLS = [function_tool("f", {"a": {"type": "integer"}}, ["a"]), function_tool("g", {"s": {"type": "string"}}, ["s"])]


def test_required_admits_one_or_more_calls_and_nothing_after_them():
    tag = format_by_name("hermes").structural_tag(TOOLS, "required", True)
    one, two = render_hermes("f", {"a": 1}), render_hermes("g", {"s": "x"})
    assert grammar_accepts(tag, one)
    assert grammar_accepts(tag, one + "\n" + two)
    assert not grammar_accepts(tag, one + " and some chatter")
    assert not grammar_accepts(tag, "")


def test_xml_value_spacing_is_formatting_not_content():
    fmt = format_by_name("xml_params")
    for before, after in (("\n", "\n"), (" ", " "), ("\n", ""), ("", "\t")):
        text = f"<tool_call>\n<function=g>\n<parameter=s>{before}a b{after}</parameter>\n</function>\n</tool_call>"
        assert fmt.parse(text, TOOLS).tool_calls[0]["function"]["arguments"] == '{"s": "a b"}'
    kept = "<tool_call>\n<function=g>\n<parameter=s>\n  a b \n\n</parameter>\n</function>\n</tool_call>"
    assert fmt.parse(kept, TOOLS).tool_calls[0]["function"]["arguments"] == '{"s": "  a b \\n"}'
