"""Every JSON Schema keyword of a tool's parameters is enforced by the grammar, or checked on the finished call,
or (under `"strict": true`) refused up front: one test per keyword, against xgrammar itself.

A keyword in GRAMMAR must make the compiled structural tag refuse a call that breaks it and accept one that
keeps it. A keyword in CHECKED must be one the grammar really lets through (else it belongs in GRAMMAR), be
caught by the argument check, and make a strict function a 400 naming it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts

from rollout_server.tool_calls import GrammarCache, ToolRequestError, format_by_name
from rollout_server.tool_calls.argument_check import ArgumentCheck
from rollout_server.tool_calls.schema_keywords import unenforced_keywords


@dataclass(frozen=True)
class Case:
    keyword: str
    parameters: dict[str, Any]
    valid: dict[str, Any]
    invalid: dict[str, Any]


def one(schema: dict[str, Any]) -> dict[str, Any]:
    """Parameters with one required property `v` of this schema."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


NODE = {"type": "object", "properties": {"name": {"type": "string", "enum": ["a", "b"]},
                                         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["name", "children"], "additionalProperties": False}
PAIR = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}

GRAMMAR_CASES = [
    Case("pattern", one({"type": "string", "pattern": "^[a-z]+$"}), {"v": "abc"}, {"v": "ABC"}),
    Case("format", one({"type": "string", "format": "date"}), {"v": "2026-12-06"}, {"v": "tomorrow"}),
    Case("format", one({"type": "string", "format": "email"}), {"v": "a@b.io"}, {"v": "no at sign"}),
    Case("multipleOf", one({"type": "integer", "multipleOf": 3}), {"v": 9}, {"v": 10}),
    Case("minItems", one({"type": "array", "items": {"type": "integer"}, "minItems": 2}), {"v": [1, 2]}, {"v": [1]}),
    Case("maxItems", one({"type": "array", "items": {"type": "integer"}, "maxItems": 1}), {"v": [1]}, {"v": [1, 2]}),
    Case("enum", one({"enum": ["red", "green"]}), {"v": "red"}, {"v": "blue"}),
    Case("const", one({"const": "fixed"}), {"v": "fixed"}, {"v": "other"}),
    Case("anyOf", one({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}), {"v": True}, {"v": "x"}),
    Case("$ref", {"$defs": {"node": NODE}, "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}},
                  "required": ["root"]},
         {"root": {"name": "a", "children": [{"name": "b", "children": []}]}},
         {"root": {"name": "a", "children": [{"name": "c", "children": []}]}}),
    Case("additionalProperties", {**PAIR, "additionalProperties": False}, {"a": 1}, {"a": 1, "c": 2}),
    Case("minimum", one({"type": "number", "minimum": 1.5}), {"v": 2}, {"v": 1}),
    Case("exclusiveMaximum", one({"type": "number", "exclusiveMaximum": 1.5}), {"v": 1}, {"v": 1.5}),
    Case("format", one({"type": "string", "format": "uuid"}), {"v": "123e4567-e89b-12d3-a456-426614174000"},
         {"v": "not-a-uuid"}),
    Case("prefixItems", one({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}),
         {"v": [1]}, {"v": ["x"]}),
    Case("maxProperties", {**PAIR, "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    Case("minProperties", {**PAIR, "minProperties": 1}, {"a": 1}, {}),
]

CHECKED_CASES = [
    Case("uniqueItems", one({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
         {"v": [1, 2]}, {"v": [1, 1]}),
    Case("minLength", one({"type": "string", "minLength": 3}), {"v": "abc"}, {"v": "ab"}),
    Case("maxLength", one({"type": "string", "maxLength": 3}), {"v": "abc"}, {"v": "abcd"}),
    Case("multipleOf", one({"type": "number", "multipleOf": 0.5}), {"v": 1.5}, {"v": 1.3}),
    Case("format", one({"type": "string", "format": "regex"}), {"v": "a+"}, {"v": "(unclosed"}),
    Case("oneOf", one({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}), {"v": -1}, {"v": 1}),
    Case("allOf", one({"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}]}), {"v": 2}, {"v": 1}),
    Case("dependentRequired", {**PAIR, "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    Case("if", {**PAIR, "if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]}},
         {"a": 1, "b": 2}, {"a": 1}),
    Case("not", one({"not": {"type": "integer"}, "type": ["integer", "string"]}), {"v": "x"}, {"v": 1}),
    Case("contains", one({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}),
         {"v": [5]}, {"v": [1]}),
    Case("dependentSchemas", {**PAIR, "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1, "b": 2}, {"a": 1}),
    # The grammar writes only the properties a schema declares by name (xgrammar's strict mode), and does not
    # hold them to these two.
    Case("patternProperties", {"type": "object", "properties": {"ab": {}},
                               "patternProperties": {"^a": {"type": "integer"}}}, {"ab": 1}, {"ab": "x"}),
    Case("propertyNames", {"type": "object", "properties": {"ab": {"type": "integer"}, "b": {"type": "integer"}},
                           "propertyNames": {"pattern": "^a"}}, {"ab": 1}, {"b": 1}),
]

HERMES = format_by_name("hermes")
XML = format_by_name("xml_params")


def tools_for(case: Case, strict: bool = False) -> list[dict]:
    function = {"name": "f", "parameters": case.parameters, **({"strict": True} if strict else {})}
    return [{"type": "function", "function": function}]


def hermes_call(arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "f", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def xml_call(arguments: dict) -> str:
    values = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function=f>\n{values}</function>\n</tool_call>"


def grammar_of(fmt, tools: list[dict]) -> xgrammar.Grammar:
    tag = fmt.structural_tag(tools, {"type": "function", "function": {"name": "f"}}, False)
    return xgrammar.Grammar.from_structural_tag(json.dumps(tag))


def call(arguments: dict) -> list[dict]:
    return [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": json.dumps(arguments)}}]


@pytest.mark.parametrize("case", GRAMMAR_CASES, ids=lambda c: c.keyword)
def test_a_grammar_keyword_is_enforced_while_sampling(case):
    assert unenforced_keywords(case.parameters, json_strings=True) == []
    grammar = grammar_of(HERMES, tools_for(case))
    assert grammar_accepts(grammar, hermes_call(case.valid))
    assert not grammar_accepts(grammar, hermes_call(case.invalid))
    assert not ArgumentCheck(HERMES, tools_for(case)).needed  # nothing left to check after sampling
    asyncio.run(GrammarCache().get(tools_for(case, strict=True), "required", None, HERMES))  # strict: accepted


@pytest.mark.parametrize("case", CHECKED_CASES, ids=lambda c: c.keyword)
def test_a_checked_keyword_passes_the_grammar_and_is_caught_on_the_finished_call(case):
    assert case.keyword in [u.keyword for u in unenforced_keywords(case.parameters, json_strings=True)]
    assert grammar_accepts(grammar_of(HERMES, tools_for(case)), hermes_call(case.invalid))  # else: GRAMMAR
    check = ArgumentCheck(HERMES, tools_for(case))
    assert check.first_invalid(hermes_call(case.valid), call(case.valid)) is None
    invalid = check.first_invalid(hermes_call(case.invalid), call(case.invalid))
    assert invalid is not None and (invalid.index, invalid.name, invalid.text_offset) == (0, "f", 0)


@pytest.mark.parametrize("case", CHECKED_CASES, ids=lambda c: c.keyword)
def test_a_strict_function_with_a_checked_keyword_is_refused_naming_it(case):
    with pytest.raises(ToolRequestError) as refused:
        asyncio.run(GrammarCache().get(tools_for(case, strict=True), "required", None, HERMES))
    assert refused.value.param.startswith("tools[0].function.parameters.")
    assert refused.value.param.endswith(case.keyword)
    assert f"'{case.keyword}'" in refused.value.message


def test_the_xml_style_enforces_max_length_and_checks_min_length():
    longest = Case("maxLength", one({"type": "string", "maxLength": 3}), {"v": "abc"}, {"v": "abcd"})
    assert unenforced_keywords(longest.parameters, json_strings=False) == []
    grammar = grammar_of(XML, tools_for(longest))
    assert grammar_accepts(grammar, xml_call(longest.valid)) and not grammar_accepts(grammar, xml_call(longest.invalid))

    shortest = Case("minLength", one({"type": "string", "minLength": 3}), {"v": "abc"}, {"v": "ab"})
    assert [u.keyword for u in unenforced_keywords(shortest.parameters, json_strings=False)] == ["minLength"]
    assert grammar_accepts(grammar_of(XML, tools_for(shortest)), xml_call(shortest.invalid))  # else: GRAMMAR
    check = ArgumentCheck(XML, tools_for(shortest))
    assert check.first_invalid(xml_call(shortest.invalid), call(shortest.invalid)) is not None


def test_what_the_grammar_can_take_of_allof_and_dependent_required_it_enforces():
    """Checked keywords the grammar still enforces in part: allOf parts that combine plainly are folded in, and a
    required trigger of dependentRequired makes its dependents required (schema_keywords.grammar_schema)."""
    folded = Case("allOf", one({"allOf": [{"type": "number", "minimum": 0}, {"type": "number", "maximum": 1}]}),
                  {"v": 0.5}, {"v": 9})
    implied = Case("dependentRequired", {**PAIR, "required": ["a"], "dependentRequired": {"a": ["b"]}},
                   {"a": 1, "b": 2}, {"a": 1})
    for case in (folded, implied):
        grammar = grammar_of(HERMES, tools_for(case))
        assert grammar_accepts(grammar, hermes_call(case.valid))
        assert not grammar_accepts(grammar, hermes_call(case.invalid))
        assert ArgumentCheck(HERMES, tools_for(case)).needed  # the rest of the keyword is still checked


def test_the_check_points_at_the_first_failing_call_after_valid_ones():
    case = CHECKED_CASES[0]  # uniqueItems
    text = "Two calls.\n" + hermes_call(case.valid) + "\n" + hermes_call(case.invalid)
    calls = call(case.valid) + call(case.invalid)
    invalid = ArgumentCheck(HERMES, tools_for(case)).first_invalid(text, calls)
    assert invalid.index == 1 and text[invalid.text_offset:] == hermes_call(case.invalid)


def test_a_call_marker_inside_an_earlier_arguments_string_is_not_taken_for_a_call():
    case = Case("uniqueItems", {"type": "object", "properties": {
        "note": {"type": "string"}, "v": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
        {}, {})
    first, second = {"note": "see <tool_call> here", "v": [1]}, {"note": "", "v": [2, 2]}
    text = hermes_call(first) + "\n" + hermes_call(second)
    invalid = ArgumentCheck(HERMES, tools_for(case)).first_invalid(text, call(first) + call(second))
    assert invalid.index == 1 and text[invalid.text_offset:] == hermes_call(second)


def test_a_repair_samples_json_strings_under_their_lengths_which_then_admit_no_escapes():
    case = Case("maxLength", one({"type": "string", "minLength": 2, "maxLength": 3}), {"v": "abc"}, {"v": "abcd"})
    relaxed, bounded = grammar_of(HERMES, tools_for(case)), grammar_of(HERMES.with_string_lengths(), tools_for(case))
    assert grammar_accepts(relaxed, hermes_call(case.invalid)) and grammar_accepts(relaxed, hermes_call({"v": "a\nb"}))
    assert grammar_accepts(bounded, hermes_call(case.valid))
    assert not grammar_accepts(bounded, hermes_call(case.invalid))
    assert not grammar_accepts(bounded, hermes_call({"v": "a"}))
    assert not grammar_accepts(bounded, hermes_call({"v": "a\nb"}))  # the price: no escape sequence
    assert XML.with_string_lengths() is XML and HERMES.with_string_lengths().name != HERMES.name
