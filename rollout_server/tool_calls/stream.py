"""The streaming parser every format shares: free text, then calls, then free text...

Free text is passed through as content, except an end that may be the start of the
call marker (held until the next piece decides). Inside a call, the format's
CallBodyParser reports the function name and argument fragments, which become OpenAI
tool-call deltas at once. Parsing a whole output is feeding it in one piece, so the
streaming and non-streaming answers are the same by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rollout_server.tool_calls.output import DeltaList, ParsedOutput, finish_reason_for, fold_deltas, new_call_id
from rollout_server.tool_calls.scanning import MalformedCall, unsure_tail_length


@dataclass
class BodyProgress:
    """What one piece of a call's text revealed."""

    name: str | None = None  # the function name, once, when complete
    arguments: str = ""  # new text of the arguments JSON
    rest: str | None = None  # set when the call ended: the text after it


class CallBodyParser(Protocol):
    def feed(self, text: str) -> BodyProgress:
        """Consumes text after the call marker; raises MalformedCall if it breaks the format."""
        ...


class WhitespaceHold:
    """Holds trailing whitespace of the content until more content follows.

    Whitespace that only separates calls (or ends the output) is template formatting;
    when the output has calls it is dropped, otherwise the content is byte-exact.
    """

    def __init__(self, deltas: DeltaList) -> None:
        self.deltas = deltas
        self.held = ""

    def add(self, text: str) -> None:
        body = text.rstrip()
        if body:
            self.deltas.content(self.held + body)
            self.held = ""
        self.held += text[len(body):]

    def release(self, keep: bool) -> None:
        if keep:
            self.deltas.content(self.held)
        self.held = ""


class StreamParser:
    """feed(delta_text) -> OpenAI delta dicts; finish(vllm_finish_reason) -> (deltas, finish_reason)."""

    def __init__(self, call_marker: str, new_body_parser: Callable[[], CallBodyParser]) -> None:
        self.call_marker = call_marker
        self.new_body_parser = new_body_parser
        self.unsure_text = ""  # free text that may be the start of the call marker
        self.body: CallBodyParser | None = None  # set while inside a call
        self.call_text = ""  # raw text of the current call, kept for the malformed case
        self.raw_mode = False  # after a malformed call, everything is content
        self.result = ParsedOutput(content=None)  # calls and flags; content lives in the deltas
        self.delta_list = DeltaList()
        self.whitespace = WhitespaceHold(self.delta_list)

    def feed(self, text: str) -> list[dict[str, Any]]:
        while text:
            if self.raw_mode:
                self.whitespace.add(text)
                text = ""
            elif self.body is None:
                text = self._feed_free_text(text)
            else:
                text = self._feed_call(text)
        return self._take_deltas()

    def finish(self, vllm_finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        if self.body is not None:
            self.result.cut_call = True
        else:
            self.whitespace.add(self.unsure_text)
        self.unsure_text = ""
        self.whitespace.release(keep=not self.result.tool_calls)
        return self._take_deltas(), finish_reason_for(self.result, vllm_finish_reason)

    def _feed_free_text(self, text: str) -> str:
        text = self.unsure_text + text
        start = text.find(self.call_marker)
        if start < 0:
            unsure = unsure_tail_length(text, self.call_marker)
            self.whitespace.add(text[: len(text) - unsure])
            self.unsure_text = text[len(text) - unsure :]
            return ""
        self.whitespace.add(text[:start])
        self.unsure_text = ""
        self.body = self.new_body_parser()
        self.call_text = self.call_marker
        return text[start + len(self.call_marker) :]

    def _feed_call(self, text: str) -> str:
        self.call_text += text
        try:
            progress = self.body.feed(text)
        except MalformedCall:
            self._give_up_on_call()
            return ""
        if progress.name is not None:
            self._start_call(progress.name)
        if progress.arguments:
            self.result.tool_calls[-1]["function"]["arguments"] += progress.arguments
            self.delta_list.arguments(len(self.result.tool_calls) - 1, progress.arguments)
        if progress.rest is None:
            return ""
        self.body = None
        if not _is_json(self.result.tool_calls[-1]["function"]["arguments"]):
            self.result.malformed_call = True
        return progress.rest

    def _start_call(self, name: str) -> None:
        call = {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": ""}}
        self.result.tool_calls.append(call)
        self.delta_list.call_start(len(self.result.tool_calls) - 1, call["id"], name)

    def _give_up_on_call(self) -> None:
        self.result.malformed_call = True
        self.raw_mode = True
        self.body = None
        self.whitespace.add(self.call_text)

    def _take_deltas(self) -> list[dict[str, Any]]:
        deltas = self.delta_list.deltas
        self.delta_list.deltas = []
        return deltas


def parse_whole(parser: StreamParser, text: str) -> ParsedOutput:
    """Parses a complete output by streaming it in one piece."""
    deltas = parser.feed(text)
    final_deltas, _ = parser.finish(None)
    content, tool_calls = fold_deltas(deltas + final_deltas)
    parsed = parser.result
    # The ids were drawn while streaming; fold_deltas kept them, so the calls match.
    return ParsedOutput(content, tool_calls, cut_call=parsed.cut_call, malformed_call=parsed.malformed_call)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
