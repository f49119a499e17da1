"""What parsing hands back: OpenAI-shaped messages, stream deltas and finish reasons."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ParsedOutput:
    """A model output split into message content and OpenAI `tool_calls`."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # The output ended inside a call (max_tokens or a stop string cut it): the last
    # call, if its name was written, has incomplete arguments.
    cut_call: bool = False
    # A call that does not follow the format (impossible under the grammar): its raw
    # text is kept in `content`.
    malformed_call: bool = False


def finish_reason_for(parsed: ParsedOutput, vllm_finish_reason: str | None) -> str | None:
    """The finish_reason to report: never "stop" for a call that was cut off."""
    if vllm_finish_reason not in (None, "stop", "length"):
        return vllm_finish_reason  # "abort" and the like pass through unchanged
    if parsed.cut_call:
        return "length"
    if parsed.malformed_call:
        return "error"
    if vllm_finish_reason == "length":
        return "length"
    if parsed.tool_calls:
        return "tool_calls"
    return vllm_finish_reason


class DeltaList:
    """OpenAI chat.completion.chunk `delta` objects, merging neighbours of one kind."""

    def __init__(self) -> None:
        self.deltas: list[dict[str, Any]] = []

    def content(self, text: str) -> None:
        if not text:
            return
        if self.deltas and "content" in self.deltas[-1]:
            self.deltas[-1]["content"] += text
        else:
            self.deltas.append({"content": text})

    def call_start(self, index: int, call_id: str, name: str) -> None:
        call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        self.deltas.append({"tool_calls": [call]})

    def arguments(self, index: int, text: str) -> None:
        if not text:
            return
        last = self.deltas[-1]["tool_calls"][0] if self.deltas and "tool_calls" in self.deltas[-1] else None
        # The call's first delta carries its name only, as OpenAI streams it.
        if last is not None and last["index"] == index and "id" not in last:
            last["function"]["arguments"] += text
        else:
            self.deltas.append({"tool_calls": [{"index": index, "function": {"arguments": text}}]})


def fold_deltas(deltas: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Joins stream deltas into one message's (content, tool_calls), as a client would."""
    content_parts: list[str] = []
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        if "content" in delta:
            content_parts.append(delta["content"])
        for call in delta.get("tool_calls", []):
            if call["index"] == len(calls):  # a call's first delta: id and name
                name = call["function"]["name"]
                calls.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": ""}})
            calls[call["index"]]["function"]["arguments"] += call["function"].get("arguments", "")
    content = "".join(content_parts)
    return (content or None), calls
