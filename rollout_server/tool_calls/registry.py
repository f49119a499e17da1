"""The known tool-call formats, and picking one from a model's chat template.

A new format is one module with a TaggedCallFormat subclass, registered here with
`register_format`. Formats are tried in registration order, most specific first.
"""

from __future__ import annotations

from rollout_server.tool_calls.base import ToolCallFormat
from rollout_server.tool_calls.hermes import HermesFormat
from rollout_server.tool_calls.xml_params import XmlParamsFormat

FORMATS: list[ToolCallFormat] = []


def register_format(tool_call_format: ToolCallFormat) -> ToolCallFormat:
    FORMATS.append(tool_call_format)
    return tool_call_format


# XML first: Qwen3-Coder templates also contain "<tool_call>", the Hermes marker.
register_format(XmlParamsFormat())
register_format(HermesFormat())


def format_for_chat_template(chat_template: str) -> ToolCallFormat:
    """The format the template renders tool calls in; LookupError if none is known."""
    for tool_call_format in FORMATS:
        if tool_call_format.matches_chat_template(chat_template):
            return tool_call_format
    known = ", ".join(f.name for f in FORMATS)
    raise LookupError(f"the chat template renders no tool-call format we know ({known})")


def format_by_name(name: str) -> ToolCallFormat:
    for tool_call_format in FORMATS:
        if tool_call_format.name == name:
            return tool_call_format
    raise LookupError(f"no tool-call format named {name!r}")
