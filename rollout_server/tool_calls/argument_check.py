"""The check on finished calls: arguments against the tool's whole schema, and where the output goes wrong.

Rule: only tools whose parameters use a keyword the grammar does not enforce (schema_keywords.CHECKED) are
checked; every other call is valid by construction and costs nothing here. A failed check names the first
call that fails and the offset in the output's text where that call begins: everything before it (content
and earlier calls) is kept, and the call is sampled again from there (rollout_server/serving/call_repair.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from rollout_server.tool_calls.base import TaggedCallFormat
from rollout_server.tool_calls.request import NO_PARAMETERS
from rollout_server.tool_calls.schema_keywords import unenforced_keywords


@dataclass(frozen=True)
class InvalidCall:
    index: int          # of the call among the output's tool_calls
    name: str
    reason: str         # the validator's message, for logs
    text_offset: int    # where the call begins in the output text (0 when it cannot be told)


class ArgumentCheck:
    """Validators for the tools of one request whose keywords the grammar does not enforce."""

    def __init__(self, fmt: TaggedCallFormat, tools: list[dict]):
        self.fmt = fmt
        self.tools = tools
        self.validators: dict[str, jsonschema.protocols.Validator] = {}
        for tool in tools:
            function = tool["function"]
            parameters = function.get("parameters") or NO_PARAMETERS
            if unenforced_keywords(parameters, json_strings=fmt.json_arguments):
                validator = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
                self.validators[function["name"]] = validator(parameters, format_checker=validator.FORMAT_CHECKER)

    @property
    def needed(self) -> bool:
        return bool(self.validators)

    def first_invalid(self, text: str, tool_calls: list[dict[str, Any]]) -> InvalidCall | None:
        """The first of the output's calls whose arguments break its tool's schema, or None."""
        for index, call in enumerate(tool_calls):
            function = call["function"]
            validator = self.validators.get(function["name"])
            if validator is None:
                continue
            try:
                arguments = json.loads(function["arguments"])
            except ValueError:  # a call cut by max_tokens: finish_reason "length" says so, nothing to repair
                continue
            error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
            if error is not None:
                where = "/".join(str(step) for step in error.absolute_path) or "(the arguments)"
                return InvalidCall(index, function["name"], f"{where}: {error.message}", self._start_of(text, index))
        return None

    def _start_of(self, text: str, index: int) -> int:
        """The offset of call `index`'s marker: the first marker before which the text parses as exactly
        `index` whole calls (a marker may also appear inside an earlier call's string argument)."""
        offset = text.find(self.fmt.call_marker)
        while offset != -1:
            before = self.fmt.parse(text[:offset], self.tools)
            if len(before.tool_calls) == index and not before.cut_call and not before.malformed_call:
                return offset
            offset = text.find(self.fmt.call_marker, offset + 1)
        return 0
