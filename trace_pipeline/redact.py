"""Removes common secret shapes from a record's text fields, and masks their tokens, before it is written.

Text: each match of SECRET_PATTERNS (only its `secret` group, when it has one: a URL keeps its user and host)
becomes `[REDACTED:<kind>]`; overlapping matches merge into the first one's kind.

Token ids: given the tokenizer's text of each id (`TokenPieces`), the prompt and completion ids are read as
text the same way, and every token whose text overlaps a secret becomes REDACTED_TOKEN_ID, with its
completion_mask 0 (never trained on). Lengths stay, so logprobs, timings and policy versions still align;
a trainer must drop or replace the masked ids (no embedding has index -1, so they cannot pass unseen).
A token's text is its own decode: a character split across byte-level tokens reads as U+FFFD, which no
secret (all ASCII) contains. Without TokenPieces (no tokenizer at hand) ids pass through unchanged.
"""
from __future__ import annotations

import copy
import dataclasses
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from trace_pipeline.records import TraceRecord

Redactor = Callable[[TraceRecord], TraceRecord]

# (kind, pattern, literals of which every match contains one). The literals are a cheap
# pre-check (a substring search costs far less than the regex) letting clean text skip it.
SECRET_PATTERNS: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("private_key", re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
     ("PRIVATE KEY",)),
    ("api_key", re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), ("sk-",)),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), ("IA",)),
    ("aws_secret_key", re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*\S+"), ("_",)),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), ("_",)),
    ("github_token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}"), ("_",)),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{16,}=*"), ("earer", "EARER")),
    # rollout-serve's own keys: "rs-" + secrets.token_urlsafe(32) (rollout_server/auth.py); a 7-character
    # prefix ("rs-AbCd", how keys are listed and revoked) is no secret and stays.
    ("rollout_serve_key", re.compile(r"\brs-[A-Za-z0-9_\-]{20,}"), ("rs-",)),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]+\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"), ("eyJ",)),
    ("slack_token", re.compile(r"\bxox[baprs]-[A-Za-z0-9\-]{10,}"), ("xox",)),
    ("stripe_key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), ("_live_", "_test_")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"), ("AIza",)),
    ("url_password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]+:(?P<secret>[^\s/@]+)@"), ("://",)),
]
# The id a token overlapping a secret gets in prompt_token_ids / completion_token_ids: no tokenizer's.
REDACTED_TOKEN_ID = -1


def secret_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every secret in text, sorted, overlapping ones merged (the first one's kind)."""
    found = []
    for kind, pattern, markers in SECRET_PATTERNS:
        if any(marker in text for marker in markers):
            for match in pattern.finditer(text):
                start, end = match.span("secret" if "secret" in pattern.groupindex else 0)
                found.append((start, end, kind))
    merged: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(found):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]), merged[-1][2])
        else:
            merged.append((start, end, kind))
    return merged


def redact_text(text: str) -> str:
    parts, position = [], 0
    for start, end, kind in secret_spans(text):
        parts += [text[position:start], f"[REDACTED:{kind}]"]
        position = end
    return "".join(parts) + text[position:] if parts else text


def redact_json(value: Any) -> Any:
    """Redacts every string value (not dict keys) inside nested dicts and lists."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    return value


class TokenPieces:
    """Each token id's text under one tokenizer (a Hugging Face tokenizer's `batch_decode`), cached: thread-safe
    and never raising (an id the tokenizer cannot decode reads as no text)."""

    def __init__(self, tokenizer):
        # Its own copy: the trace writer thread decodes while the front door encodes, and a Rust tokenizer in
        # use by one thread may refuse another ("Already borrowed").
        self._tokenizer = copy.deepcopy(tokenizer)
        self._pieces: dict[int, str] = {}
        self._lock = threading.Lock()

    def __call__(self, ids: Iterable[int]) -> list[str]:
        ids = list(ids)
        missing = sorted({i for i in ids if i not in self._pieces})
        if missing:
            with self._lock:
                self._pieces.update(zip(missing, self._decode(missing)))
        return [self._pieces[i] for i in ids]

    def _decode(self, ids: list[int]) -> list[str]:
        try:
            return self._tokenizer.batch_decode([[i] for i in ids])
        except Exception:  # noqa: BLE001 -- one id it cannot decode must not cost the others their text
            return [self._decode_one(i) for i in ids]

    def _decode_one(self, token_id: int) -> str:
        try:
            return self._tokenizer.decode([token_id])
        except Exception:  # noqa: BLE001 -- redaction must never fail a record over one id
            return ""


def masked_positions(ids: list[int], pieces: TokenPieces) -> list[int]:
    """Indexes of the tokens whose text overlaps a secret in the text of all of `ids`."""
    texts = pieces(ids)
    spans = secret_spans("".join(texts))
    if not spans:
        return []
    positions, start = [], 0
    for i, text in enumerate(texts):
        end = start + len(text)
        if any(start < span_end and span_start < end for span_start, span_end, _ in spans):
            positions.append(i)
        start = end
    return positions


def redact_record(rec: TraceRecord, token_pieces: TokenPieces | None = None) -> TraceRecord:
    """Returns a copy of rec with secrets replaced by [REDACTED:<kind>] in text fields and, given the tokenizer's
    pieces, their tokens' ids replaced by REDACTED_TOKEN_ID (module doc)."""
    redacted = dataclasses.replace(
        rec,
        request_messages=redact_json(rec.request_messages),
        tools=redact_json(rec.tools),
        prompt_text=redact_json(rec.prompt_text),
        output_message=redact_json(rec.output_message),
        output_text=redact_json(rec.output_text),
        sampling_params=redact_json(rec.sampling_params),
    )
    if token_pieces is None:
        return redacted
    if masked := masked_positions(rec.prompt_token_ids, token_pieces):
        redacted.prompt_token_ids = _masked(rec.prompt_token_ids, masked)
    if masked := masked_positions(rec.completion_token_ids, token_pieces):
        redacted.completion_token_ids = _masked(rec.completion_token_ids, masked)
        mask = list(rec.completion_mask) if rec.completion_mask is not None else [1] * len(rec.completion_token_ids)
        for i in masked:
            mask[i] = 0   # a secret is never trained on
        redacted.completion_mask = mask
    return redacted


def _masked(ids: list[int], positions: list[int]) -> list[int]:
    ids = list(ids)
    for i in positions:
        ids[i] = REDACTED_TOKEN_ID
    return ids
