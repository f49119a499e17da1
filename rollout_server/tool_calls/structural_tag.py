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
from rollout_server.tool_calls.schema_keywords import grammar_schema

# Whitespace inside the arguments JSON is capped at one character per gap, so a weak
# model cannot spend its token budget on indentation and never close the call.
MAX_WHITESPACE_PER_GAP = 1


# xgrammar's messages start with a time and a C++ source location: "[05:30:03] /project/cpp/x.cc:83: ..."
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def json_schema_content(parameters: dict[str, Any], style: str = "json",
                        string_lengths: bool = False) -> dict[str, Any]:
    """The tag content for arguments of this schema. Keywords the grammar cannot enforce are checked on the
    finished call (schema_keywords.py); `string_lengths` keeps minLength/maxLength of JSON strings in the
    grammar all the same, which then admits no escape sequence in those strings (a repair's grammar)."""
    parameters = grammar_schema(parameters, json_strings=style == "json" and not string_lengths)
    content: dict[str, Any] = {
        "type": "json_schema",
        "json_schema": parameters,
        "max_whitespace_cnt": MAX_WHITESPACE_PER_GAP,
    }
    if style != "json":
        content["style"] = style
    return content


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
