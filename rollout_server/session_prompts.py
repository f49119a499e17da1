"""Tokenizing a returning session's prompt by what it adds.

A coding agent sends its whole conversation again every turn, to add a little at its end. Rendering the
chat template is cheap; tokenizing the whole text again is not, and it sits in the turn's time to first
token (docs/benchmarks.md, "Measurements behind design choices"). So the front door keeps, per
named session, the start of the last prompt it rendered and the token ids of that start; a prompt that
begins with the same text is tokenized from there on only.

Why the ids stay exact: a Hugging Face tokenizer first splits its input at added tokens (`<|im_start|>`,
...) and tokenizes each piece on its own. A cut just before such a token is a place where the whole text
is split anyway, so the ids of the whole are the ids before the cut followed by the ids from it. Cuts are
made only before special tokens matched on the raw text that take no whitespace beside them, and a
tokenizer whose pieces do not add up on a probe conversation keeps no prefixes at all.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from rollout_server.serving.team_scope import team_scoped

log = logging.getLogger(__name__)

# Rendered with the model's own template to check that pieces cut at its markers add up.
PROBE_CONVERSATION = [
    {"role": "system", "content": "You are a coding agent.  Tabs\tand  spaces stay."},
    {"role": "user", "content": "Read main.py\n\n"},
    {"role": "assistant", "content": " It defines `main()`; nothing else.\n"},
    {"role": "user", "content": "héllo wörld 👋 — again"},
]


@dataclass
class _Prefix:
    text: str
    ids: array  # the token ids of `text`; 4 bytes each, where a list of ints takes ~36


class SessionPrompts:
    """Per-session prompt prefixes and their token ids, least recently used dropped past `max_tokens`."""

    def __init__(self, encode: Callable[[str], list[int]], cut_markers: list[str], max_tokens: int):
        self._encode = encode
        self._markers = cut_markers
        self._max_tokens = max_tokens if cut_markers else 0
        self._prefixes: OrderedDict[str, _Prefix] = OrderedDict()
        self._held_tokens = 0
        self._lock = threading.Lock()  # prompts are tokenized in worker threads
        self.reused_tokens = 0  # ids taken from a session's earlier prompt instead of tokenized again

    @property
    def enabled(self) -> bool:
        return self._max_tokens > 0

    def encode(self, session_id: str | None, text: str) -> list[int]:
        """The token ids of `text`, the prompt of `session_id` (None: a prompt no later turn will extend)."""
        if session_id is None or not self.enabled:
            return self._encode(text)
        known = self._known_prefix(session_id, text)
        cut = self._last_cut(text, len(known.text))
        head_ids = known.ids + array("i", self._encode(text[len(known.text):cut]))
        tail_ids = self._encode(text[cut:])
        self._remember(session_id, _Prefix(text[:cut], head_ids), reused=len(known.ids))
        return head_ids.tolist() + tail_ids

    def _known_prefix(self, session_id: str, text: str) -> _Prefix:
        with self._lock:
            prefix = self._prefixes.get(session_id)
        if prefix is not None and text.startswith(prefix.text) and self._marker_at(text, len(prefix.text)):
            return prefix
        return _Prefix("", array("i"))  # a new session, or its history changed (edited, or re-rendered)

    def _marker_at(self, text: str, at: int) -> bool:
        """Whether a marker begins at `at`: only then is the whole text split there too."""
        return any(text.startswith(marker, at) for marker in self._markers)

    def _last_cut(self, text: str, start: int) -> int:
        """Where the last marker in text[start:] begins; `start` when there is none."""
        return max([start, *(text.rfind(marker, start) for marker in self._markers)])

    def _remember(self, session_id: str, prefix: _Prefix, reused: int) -> None:
        with self._lock:
            self.reused_tokens += reused
            old = self._prefixes.pop(session_id, None)
            self._held_tokens -= len(old.ids) if old else 0
            if len(prefix.ids) > self._max_tokens:
                return
            self._prefixes[session_id] = prefix
            self._held_tokens += len(prefix.ids)
            while self._held_tokens > self._max_tokens:
                _, dropped = self._prefixes.popitem(last=False)
                self._held_tokens -= len(dropped.ids)


def team_session(team: str, session_id: str | None) -> str | None:
    """What a named session's prompt is kept under: per team, so that no caller's prompt is ever tokenized
    faster thanks to (and could so time a guess at) another team's."""
    return team_scoped(team, session_id) if session_id else None


def cut_markers_of(hf_tokenizer) -> list[str]:
    """The added tokens of a Hugging Face tokenizer before which its input is always split: special,
    matched on the raw text, taking no whitespace on either side, not limited to whole words."""
    if getattr(hf_tokenizer, "split_special_tokens", False):
        return []  # special tokens are tokenized as text: no split to rely on
    return [tok.content for tok in hf_tokenizer.added_tokens_decoder.values()
            if tok.special and not tok.normalized and not tok.lstrip and not tok.rstrip and not tok.single_word]


def pieces_add_up(encode: Callable[[str], list[int]], text: str, markers: list[str]) -> bool:
    """Whether `text`, cut before every marker in it, tokenizes to the same ids piece by piece as whole."""
    cuts = sorted({i for marker in markers for i in _occurrences(text, marker)} | {0, len(text)})
    pieces = [encode(text[a:b]) for a, b in zip(cuts, cuts[1:])]
    return [t for piece in pieces for t in piece] == encode(text)


def _occurrences(text: str, marker: str) -> list[int]:
    found, at = [], text.find(marker)
    while at >= 0:
        found.append(at)
        at = text.find(marker, at + 1)
    return found


def _probe_text(hf_tokenizer, markers: list[str]) -> str:
    """The probe conversation in the model's chat template; for a template that refuses it (no system role,
    say), the probe's words after each marker."""
    try:
        return hf_tokenizer.apply_chat_template(PROBE_CONVERSATION, tokenize=False, add_generation_prompt=True)
    except Exception:
        words = " ".join(message["content"] for message in PROBE_CONVERSATION)
        return "".join(marker + words for marker in markers)


def session_prompts_for(hf_tokenizer, encode: Callable[[str], list[int]], max_tokens: int) -> SessionPrompts:
    """A SessionPrompts for this tokenizer, cutting before the special tokens its chat template writes (a
    Llama 3 tokenizer has 256, a conversation 4: each is searched for in every prompt). It keeps no prefixes
    when the pieces of the probe conversation do not add up."""
    if max_tokens <= 0:
        return SessionPrompts(encode, [], 0)
    markers = cut_markers_of(hf_tokenizer)
    probe = _probe_text(hf_tokenizer, markers)
    markers = [marker for marker in markers if marker in probe]
    if not markers:
        log.warning("returning session turns are tokenized whole: the chat template writes no special token to "
                    "cut before")
    elif not pieces_add_up(encode, probe, markers):
        log.warning("returning session turns are tokenized whole: cut before %s, this tokenizer's pieces do not "
                    "add up to the whole", markers)
        markers = []
    return SessionPrompts(encode, markers, max_tokens)
