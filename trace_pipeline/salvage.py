"""One bad record never costs its neighbours: redaction and encoding happen per record, and a record that
fails them loses only the fields that make it fail.

The rule, for each record of a group commit (and each spilled record):
1. redact it and encode it for the WAL; on success that is what is stored;
2. else find the free-form fields that fail on their own (each tried alone, the others set to None), set
   them to None and name them in `dropped_fields`, and store what is left, flagged so;
3. if even that fails, the record is unstorable: `UnstorableRecord`, which the caller counts and logs,
   for this record alone.

The free-form fields are the client's JSON (messages, tools, sampling params) and text: the only fields
whose shape a client controls (a message nested 700 levels deep exhausts Python's recursion in redaction
and msgspec's in encoding). Ids, tokens and timings are typed by the front door and are never dropped.
"""
from __future__ import annotations

import dataclasses

from trace_pipeline import codec
from trace_pipeline.records import TraceRecord
from trace_pipeline.redact import Redactor

FREE_FORM_FIELDS = ("request_messages", "tools", "prompt_text", "output_message", "output_text", "sampling_params")


class UnstorableRecord(Exception):
    """The record cannot be redacted or encoded even without its free-form fields."""


def prepare(record: TraceRecord, redact: Redactor | None) -> tuple[TraceRecord, bytes]:
    """The record as stored (redacted, maybe without some fields) and its WAL payload (rule: module doc)."""
    try:
        return _attempt(record, redact)
    except Exception as first_error:
        present = [name for name in FREE_FORM_FIELDS if getattr(record, name) is not None]
        failing = [name for name in present if not _succeeds(_only(record, name, present), redact)]
        if not failing:
            raise UnstorableRecord(f"{type(first_error).__name__}: {first_error}") from first_error
    stripped = dataclasses.replace(record, dropped_fields=failing, **{name: None for name in failing})
    try:
        return _attempt(stripped, redact)
    except Exception as exc:
        raise UnstorableRecord(f"{type(exc).__name__}: {exc} (also without {', '.join(failing)})") from exc


def _attempt(record: TraceRecord, redact: Redactor | None) -> tuple[TraceRecord, bytes]:
    stored = redact(record) if redact else record
    return stored, codec.encode(stored)


def _only(record: TraceRecord, keep: str, present: list[str]) -> TraceRecord:
    """The record with every present free-form field but `keep` set to None."""
    return dataclasses.replace(record, **{name: None for name in present if name != keep})


def _succeeds(record: TraceRecord, redact: Redactor | None) -> bool:
    try:
        _attempt(record, redact)
    except Exception:  # noqa: BLE001 -- any failure marks the field as one to drop
        return False
    return True
