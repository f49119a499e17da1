"""Removes common secret shapes from a record's text fields before it is written.

Only text is touched: token ids, logprobs and timings pass through unchanged, so a
redacted record still trains exactly like the original (the model saw the tokens).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

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
]


def redact_text(text: str) -> str:
    for kind, pattern, markers in SECRET_PATTERNS:
        if any(marker in text for marker in markers):
            text = pattern.sub(f"[REDACTED:{kind}]", text)
    return text


def redact_json(value: Any) -> Any:
    """Redacts every string value (not dict keys) inside nested dicts and lists."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    return value


def redact_record(rec: TraceRecord) -> TraceRecord:
    """Returns a copy of rec with secrets replaced by [REDACTED:<kind>] in text fields."""
    return dataclasses.replace(
        rec,
        request_messages=redact_json(rec.request_messages),
        tools=redact_json(rec.tools),
        prompt_text=redact_json(rec.prompt_text),
        output_message=redact_json(rec.output_message),
        output_text=redact_json(rec.output_text),
        sampling_params=redact_json(rec.sampling_params),
    )
