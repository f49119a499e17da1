"""The interface every tool-call format implements, and the base most formats share.

A format knows three things about its model family: how one call for a tool looks as
an xgrammar tag, which text opens a call, and how to read a call's body. The base
class turns those into the structural tag for a request and into parsers.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

from rollout_server.tool_calls.output import ParsedOutput
from rollout_server.tool_calls.request import FunctionTool, read_tool_request
from rollout_server.tool_calls.stream import CallBodyParser, StreamParser, parse_whole
from rollout_server.tool_calls.structural_tag import combine_tags


class ToolCallFormat(Protocol):
    name: str
    call_marker: str
    json_arguments: bool

    def matches_chat_template(self, chat_template: str) -> bool: ...

    def structural_tag(self, tools: list[dict], choice: Any, parallel: bool | None) -> dict | None: ...

    def parse(self, text: str, tools: list[dict] | None = None) -> ParsedOutput: ...

    def stream_parser(self, tools: list[dict] | None = None) -> StreamParser: ...

    def with_string_lengths(self) -> ToolCallFormat: ...


class TaggedCallFormat:
    """A format whose calls each open with `call_marker` (the grammar's trigger)."""

    name: str
    call_marker: str
    # Templates of this format iterate over a call's arguments, so the history's JSON-string
    # arguments are handed to them as objects (Hermes templates print the string as is).
    template_wants_argument_objects: bool = False
    # Arguments are written as JSON (minLength/maxLength are then checked after, not enforced: schema_keywords.py).
    json_arguments: bool = True
    # The grammar enforces minLength/maxLength of JSON strings too, at the price of escape sequences in them:
    # what a repair samples under, after a call broke a length (with_string_lengths).
    string_lengths: bool = False

    def with_string_lengths(self) -> TaggedCallFormat:
        """This format with string lengths in its grammar (its own name, so grammars are cached apart)."""
        if not self.json_arguments or self.string_lengths:
            return self
        bounded = copy.copy(self)
        bounded.name, bounded.string_lengths = f"{self.name}+string_lengths", True
        return bounded

    def matches_chat_template(self, chat_template: str) -> bool:
        raise NotImplementedError

    def tool_tag(self, tool: FunctionTool) -> dict[str, Any]:
        """The xgrammar tag for one call of `tool`; its begin starts with call_marker."""
        raise NotImplementedError

    def body_parser(self, tools: list[FunctionTool]) -> CallBodyParser:
        """A parser for the text after call_marker, up to the end of the call."""
        raise NotImplementedError

    def structural_tag(self, tools: list[dict], choice: Any, parallel: bool | None) -> dict | None:
        """The xgrammar structural tag (call validate_tool_request first); None = no constraint."""
        function_tools, tool_choice = read_tool_request(tools, choice)
        tags = {tool.name: self.tool_tag(tool) for tool in function_tools}
        return combine_tags(tags, self.call_marker, tool_choice, parallel is not False)

    def parse(self, text: str, tools: list[dict] | None = None) -> ParsedOutput:
        return parse_whole(self.stream_parser(tools), text)

    def stream_parser(self, tools: list[dict] | None = None) -> StreamParser:
        function_tools, _ = read_tool_request(tools, None)
        return StreamParser(self.call_marker, lambda: self.body_parser(function_tools))
