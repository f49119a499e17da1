"""Qwen3-Coder calls: one XML element per parameter, values written raw.

    <tool_call>
    <function=edit_file>
    <parameter=path>
    src/app.py
    </parameter>
    <parameter=line>
    42
    </parameter>
    </function>
    </tool_call>

The template puts a newline after `<parameter=key>` and before `</parameter>`, and the
grammar admits one whitespace character in each place; exactly one leading and one
trailing whitespace character are formatting and are removed, the rest of the value is
kept byte for byte. String parameters are JSON-quoted into `arguments` (and streamed as they
arrive); other values are JSON already and are copied. A string value cannot
contain `</parameter>` (the grammar forbids it); a string inside an array or object
value can, and there it is content, not the value's end.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from rollout_server.tool_calls.base import TaggedCallFormat
from rollout_server.tool_calls.request import FunctionTool
from rollout_server.tool_calls.scanning import match_start, unsure_tail_length
from rollout_server.tool_calls.stream import BodyProgress
from rollout_server.tool_calls.structural_tag import json_schema_content, tag

CALL_START = "<tool_call>"
VALUE_END = "</parameter>"
FORMATTING = " \t\r\n"  # one of these on each side of a value is formatting, not content

_FUNCTION_OPEN = regex.compile(r"\s*<function=(?P<name>[^>\s]+)>")
_NEXT_PARAMETER_OR_END = regex.compile(r"\s*(?:<parameter=(?P<key>[^>]+)>|(?P<end></function>))")
_CALL_END = regex.compile(r"\s*</tool_call>")


class XmlParamsFormat(TaggedCallFormat):
    name = "xml_params"
    call_marker = CALL_START
    template_wants_argument_objects = True
    json_arguments = False  # values are raw text: string lengths are enforced by the grammar

    def matches_chat_template(self, chat_template: str) -> bool:
        return "<function=" in chat_template and "<parameter=" in chat_template

    def tool_tag(self, tool: FunctionTool) -> dict[str, Any]:
        begin = f"{CALL_START}\n<function={tool.name}>\n"
        content = json_schema_content(tool.parameters, style="qwen_xml")
        # No newline before </function>: a call without parameters is written
        # `<function=name>\n</function>`; with parameters the newline after the last
        # </parameter> is allowed as whitespace.
        return tag(begin, content, "</function>\n</tool_call>")

    def body_parser(self, tools: list[FunctionTool]) -> XmlCallBody:
        return XmlCallBody({tool.name: tool.parameters for tool in tools})


class XmlCallBody:
    """Reads `<function=...>`, its parameters and `</tool_call>`, piece by piece."""

    def __init__(self, schemas_by_name: dict[str, dict[str, Any]]) -> None:
        self.schemas_by_name = schemas_by_name
        self.stage = "function"  # function -> between -> value -> between ... -> call_end
        self.pending = ""  # text not yet decided
        self.properties: dict[str, Any] = {}
        self.parameter_count = 0
        self.value: ParameterValue | None = None

    def feed(self, text: str) -> BodyProgress:
        progress = BodyProgress()
        self.pending += text
        while self.pending and progress.rest is None and self._step(progress):
            pass
        return progress

    def _step(self, progress: BodyProgress) -> bool:
        """Advances one stage if the pending text allows it; False when it must wait."""
        if self.stage == "function":
            return self._read_function_open(progress)
        if self.stage == "between":
            return self._read_next_parameter_or_end(progress)
        if self.stage == "value":
            return self._read_value(progress)
        return self._read_call_end(progress)

    def _read_function_open(self, progress: BodyProgress) -> bool:
        opening = match_start(_FUNCTION_OPEN, self.pending)
        if opening is None:
            return False
        progress.name = opening.group("name")
        schema = self.schemas_by_name.get(progress.name, {})
        self.properties = schema.get("properties", {})
        self._advance("between", opening.end())
        return True

    def _read_next_parameter_or_end(self, progress: BodyProgress) -> bool:
        found = match_start(_NEXT_PARAMETER_OR_END, self.pending)
        if found is None:
            return False
        if found.group("end"):
            progress.arguments += "}" if self.parameter_count else "{}"
            self._advance("call_end", found.end())
            return True
        key = found.group("key")
        self.value = ParameterValue(self.properties.get(key, {}))
        separator = ", " if self.parameter_count else "{"
        progress.arguments += f"{separator}{json.dumps(key, ensure_ascii=False)}: {self.value.opening()}"
        self.parameter_count += 1
        self._advance("value", found.end())
        return True

    def _read_value(self, progress: BodyProgress) -> bool:
        end = self.pending.find(VALUE_END)
        while end >= 0 and self.value.inside_json_string(self.pending[:end]):
            end = self.pending.find(VALUE_END, end + 1)
        if end < 0:
            sure = len(self.pending) - unsure_tail_length(self.pending, VALUE_END)
            if sure and self.pending[sure - 1] in FORMATTING:
                sure -= 1  # may be the formatting character before </parameter>: wait and see
            progress.arguments += self.value.add(self.pending[:sure])
            self.pending = self.pending[sure:]
            return False
        raw = self.pending[:end]
        progress.arguments += self.value.add(raw[:-1] if raw[-1:] in FORMATTING else raw)
        progress.arguments += self.value.closing()
        self._advance("between", end + len("</parameter>"))
        return True

    def _read_call_end(self, progress: BodyProgress) -> bool:
        closing = match_start(_CALL_END, self.pending)
        if closing is None:
            return False
        progress.rest = self.pending[closing.end() :]
        self.pending = ""
        return True

    def _advance(self, stage: str, consumed: int) -> None:
        self.stage = stage
        self.pending = self.pending[consumed:]


class ParameterValue:
    """One parameter's value as JSON text: strings stream out, other values wait for the end."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.types = _declared_types(schema)
        self.is_string = self.types == {"string"} or _is_string_enum(schema)
        self.seen_first_character = False
        self.raw = ""

    def opening(self) -> str:
        return '"' if self.is_string else ""

    def add(self, text: str) -> str:
        """Takes raw value text; returns the JSON text that can be emitted now."""
        if text and not self.seen_first_character:
            self.seen_first_character = True
            text = text[1:] if text[:1] in FORMATTING else text
        if self.is_string:
            return json.dumps(text, ensure_ascii=False)[1:-1]
        self.raw += text
        return ""

    def closing(self) -> str:
        if self.is_string:
            return '"'
        return _as_json(self.raw, self.types)

    def inside_json_string(self, more: str) -> bool:
        """Whether `more`, after what was added, ends inside a JSON string of an array or object value."""
        if self.is_string:
            return False
        text = self.raw + more
        if text.lstrip(FORMATTING)[:1] not in ("[", "{"):
            return False
        inside = escaped = False
        for char in text:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = inside
            elif char == '"':
                inside = not inside
        return inside


def _declared_types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    return set()


def _is_string_enum(schema: dict[str, Any]) -> bool:
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return "type" not in schema and bool(choices) and all(isinstance(choice, str) for choice in choices)


def _as_json(raw: str, types: set[str]) -> str:
    """A non-string value: the model's JSON text if it is JSON of an allowed type, else a string."""
    try:
        value = json.loads(raw)
    except ValueError:
        return json.dumps(raw, ensure_ascii=False)
    if types and not (_json_types(value) & types) and "string" in types:
        return json.dumps(raw, ensure_ascii=False)
    return raw.strip()


def _json_types(value: Any) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    if value is None:
        return {"null"}
    return {"array"} if isinstance(value, list) else {"object"}
