"""Small incremental text scanners shared by the format parsers.

Each works on text that arrives in pieces: it answers "done", "not yet" or "never",
so a parser decides as soon as the text allows it, whatever the chunking.
"""

from __future__ import annotations

import regex  # the `regex` package: its partial matching answers "not yet"


class MalformedCall(ValueError):
    """The text inside a call does not follow the format."""


def unsure_tail_length(text: str, marker: str) -> int:
    """Length of the longest end of `text` that may be the start of `marker`."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def match_start(pattern: regex.Pattern, text: str) -> regex.Match | None:
    """The pattern's match at the start of `text`, or None while more text may complete it.

    Raises MalformedCall when no continuation of `text` can match.
    """
    match = pattern.match(text, partial=True)
    if match is None:
        raise MalformedCall(f"expected {pattern.pattern!r} at {text[:40]!r}")
    if match.partial:
        return None
    return match


_STRING_CHARS = regex.compile(r'[^"\\]*')
_PLAIN_CHARS = regex.compile(r'[^"{}\[\]]*')


class JsonValueScanner:
    """Finds where a JSON object ends, one piece of text at a time.

    It tracks nesting and strings only (the grammar guarantees the rest), so a `}` or
    `</tool_call>` inside a string never ends the value.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.after_backslash = False  # the previous piece ended inside an escape

    def feed(self, text: str) -> tuple[str, str | None]:
        """Returns (value text consumed, the rest after the value's end, or None if not ended)."""
        position = 0
        while position < len(text):
            if self.after_backslash:
                self.after_backslash = False
                position += 1
            elif self.in_string:
                position = _STRING_CHARS.match(text, position).end()
                if position < len(text):
                    self.after_backslash = text[position] == "\\"
                    self.in_string = self.after_backslash
                    position += 1
            else:
                character = text[position]
                if self.depth == 0 and character != "{":
                    raise MalformedCall(f"arguments must be a JSON object, got {text[position:position + 20]!r}")
                position += 1
                if character == '"':
                    self.in_string = True
                elif character in "{[":
                    self.depth += 1
                elif character in "}]":
                    self.depth -= 1
                    if self.depth == 0:
                        return text[:position], text[position:]
                else:
                    position = _PLAIN_CHARS.match(text, position).end()
        return text, None
