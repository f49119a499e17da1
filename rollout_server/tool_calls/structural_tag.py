"""The xgrammar structural tag for one request: which calls the model may write.

A format supplies one `tag` per tool (begin text, argument schema, end text); the
choice and parallel_tool_calls decide how the tags combine:

  none      no constraint at all
  auto      free text; writing the trigger (the call's opening text) commits to a call
  required  one or more calls (one per line) and nothing else
  named     exactly one call, of that function, and nothing else
  parallel_tool_calls=false adds stop_after_first: nothing may follow the first call.
"""

from __future__ import annotations

import re
from typing import Any

from rollout_server.tool_calls.request import FunctionTool, ToolChoice

# Whitespace inside the arguments JSON is capped at one character per gap, so a weak
# model cannot spend its token budget on indentation and never close the call.
MAX_WHITESPACE_PER_GAP = 1


# xgrammar 0.2.8 compiles a JSON string with minLength/maxLength to a rule that admits
# no escape sequence, so a bounded string could hold no quote, backslash or newline:
# the model would be forced to mangle its text. Lengths are dropped instead (the raw
# XML style has no such problem).
_STRING_LENGTH_BOUNDS = ("minLength", "maxLength")
# xgrammar's messages start with a time and a C++ source location: "[05:30:03] /project/cpp/x.cc:83: ..."
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def json_schema_content(parameters: dict[str, Any], style: str = "json") -> dict[str, Any]:
    if style == "json":
        parameters = without_string_length_bounds(parameters)
    content: dict[str, Any] = {
        "type": "json_schema",
        "json_schema": parameters,
        "max_whitespace_cnt": MAX_WHITESPACE_PER_GAP,
    }
    if style != "json":
        content["style"] = style
    return content


def without_string_length_bounds(schema: Any) -> Any:
    """A copy of the schema without minLength/maxLength, in every subschema."""
    if not isinstance(schema, dict):
        return schema
    relaxed = {key: value for key, value in schema.items() if key not in _STRING_LENGTH_BOUNDS}
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            relaxed[key] = {name: without_string_length_bounds(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            relaxed[key] = [without_string_length_bounds(sub) for sub in schema[key]]
    for key in _SCHEMA_VALUES:
        if key in schema:
            relaxed[key] = without_string_length_bounds(schema[key])
    return relaxed


def tag(begin: str, content: dict[str, Any], end: str) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def combine_tags(
    tags_by_name: dict[str, dict[str, Any]], trigger: str, choice: ToolChoice, parallel: bool
) -> dict[str, Any] | None:
    """The structural tag for `choice`, or None when tools are not to be enforced."""
    if choice.mode == "none" or not tags_by_name:
        return None
    if choice.mode == "named":
        return {"type": "structural_tag", "format": tags_by_name[choice.name]}
    if choice.mode == "required":
        # Not triggered_tags: that admits free text after the calls, which a weak model
        # writes until max_tokens, so a complete call would end with "length".
        return {
            "type": "structural_tag",
            "format": {
                "type": "tags_with_separator",
                "tags": list(tags_by_name.values()),
                "separator": "\n",
                "at_least_one": True,
                "stop_after_first": not parallel,
            },
        }
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": list(tags_by_name.values()),
            "at_least_one": False,
            "stop_after_first": not parallel,
        },
    }


def tags_for(tools: list[FunctionTool], make_tag) -> dict[str, dict[str, Any]]:
    return {tool.name: make_tag(tool) for tool in tools}


def xgrammar_reason(error: Exception) -> str:
    """An xgrammar error's message without its time and C++ source location."""
    return _XGRAMMAR_PREFIX.sub("", str(error).strip())
