"""Hermes / Qwen2.5 / Qwen3 calls: a JSON object between <tool_call> tags.

    <tool_call>
    {"name": "read_file", "arguments": {"path": "a.py"}}
    </tool_call>

The arguments object is passed through byte for byte (escapes, unicode, a literal
`</tool_call>` inside a string), so OpenAI's `arguments` string is exactly what the
model wrote.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from rollout_server.tool_calls.base import TaggedCallFormat
from rollout_server.tool_calls.request import FunctionTool
from rollout_server.tool_calls.scanning import JsonValueScanner, match_start
from rollout_server.tool_calls.stream import BodyProgress
from rollout_server.tool_calls.structural_tag import json_schema_content, tag

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"

# Everything before the arguments value; (?=\S) waits for the value's first character.
_HEADER = regex.compile(r'\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
_TAIL = regex.compile(r"\s*\}\s*" + regex.escape(CALL_END))


class HermesFormat(TaggedCallFormat):
    name = "hermes"
    call_marker = CALL_START

    def matches_chat_template(self, chat_template: str) -> bool:
        return CALL_START in chat_template

    def tool_tag(self, tool: FunctionTool) -> dict[str, Any]:
        begin = f'{CALL_START}\n{{"name": {json.dumps(tool.name)}, "arguments": '
        return tag(begin, json_schema_content(tool.parameters, string_lengths=self.string_lengths), "}\n" + CALL_END)

    def body_parser(self, tools: list[FunctionTool]) -> HermesCallBody:
        return HermesCallBody()


class HermesCallBody:
    """Reads `{"name": ..., "arguments": {...}}` then `</tool_call>`, piece by piece."""

    def __init__(self) -> None:
        self.stage = "header"  # header -> arguments -> tail
        self.pending = ""  # header or tail text not yet decided
        self.arguments = JsonValueScanner()

    def feed(self, text: str) -> BodyProgress:
        progress = BodyProgress()
        if self.stage == "header":
            text = self._read_header(text, progress)
        if self.stage == "arguments" and text:
            text = self._read_arguments(text, progress)
        if self.stage == "tail" and text:
            self._read_tail(text, progress)
        return progress

    def _read_header(self, text: str, progress: BodyProgress) -> str:
        self.pending += text
        header = match_start(_HEADER, self.pending)
        if header is None:
            return ""
        progress.name = json.loads(f'"{header.group("name")}"')
        self.stage = "arguments"
        rest, self.pending = self.pending[header.end() :], ""
        return rest

    def _read_arguments(self, text: str, progress: BodyProgress) -> str:
        consumed, rest = self.arguments.feed(text)
        progress.arguments += consumed
        if rest is None:
            return ""
        self.stage = "tail"
        return rest

    def _read_tail(self, text: str, progress: BodyProgress) -> None:
        self.pending += text
        tail = match_start(_TAIL, self.pending)
        if tail is not None:
            progress.rest = self.pending[tail.end() :]
            self.pending = ""


