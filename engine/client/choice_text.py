"""A choice's text, decoded token by token as the engine streams its ids, and ended at the request's stop strings.

Dynamo's frontend does this (in Rust) for the requests it serves; the requests the front door routes itself
(engine/client/embedded_router.py) get it from here. As in vLLM and Dynamo:
- a stop string counts only once more than `min_tokens` tokens were generated;
- the token that completes a stop string is the choice's last one; the text ends before the stop string, or
  after it with `include_stop_str_in_output`;
- text that could still be the start of a stop string is held back until the next tokens tell.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


@dataclass
class TextStep:
    kept: int          # how many of the new ids belong to the choice (fewer when a stop string ended it)
    text: str          # text that can go to the client now
    stopped: bool      # a stop string ended the choice


class ChoiceText:
    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None, min_tokens: int = 0,
                 include_stop_str_in_output: bool = False, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._decoder = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stops = [s for s in stop or [] if s]
        self._min_tokens = min_tokens
        self._include_stop = include_stop_str_in_output
        self._pending = ""  # decoded, not sent yet
        self._generated = 0

    def add(self, token_ids: list[int]) -> TextStep:
        for i, token_id in enumerate(token_ids):
            piece = self._decoder.step(self._tokenizer, token_id) or ""
            self._generated += 1
            if not piece:
                continue
            self._pending += piece
            if self._stops and self._generated > self._min_tokens:
                end = self._stop_end(len(piece))
                if end is not None:
                    text, self._pending = self._pending[:end], ""
                    return TextStep(i + 1, text, True)
        return TextStep(len(token_ids), self._release(), False)

    def finish(self) -> str:
        """What was held back, once the choice ended for another reason (EOS, max_tokens)."""
        text, self._pending = self._pending, ""
        return text

    def _stop_end(self, new_chars: int) -> int | None:
        """Where the text ends if a stop string completed among the last `new_chars` characters."""
        longest = max(len(s) for s in self._stops)
        window = max(0, len(self._pending) - new_chars - longest + 1)
        found = [(at, stop) for stop in self._stops if (at := self._pending.find(stop, window)) != -1]
        if not found:
            return None
        at, stop = min(found)
        return at + len(stop) if self._include_stop else at

    def _release(self) -> str:
        """The pending text but its end that might begin a stop string."""
        held = _stop_prefix_at_end(self._pending, self._stops) if self._stops else 0
        cut = len(self._pending) - held
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text


def _stop_prefix_at_end(text: str, stops: list[str]) -> int:
    """The length of the longest end of `text` that some stop string starts with."""
    for length in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        end = text[-length:]
        if any(stop.startswith(end) for stop in stops):
            return length
    return 0
