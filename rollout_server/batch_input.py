"""A Batch API input file: JSONL, one request per line, checked line by line.

Each line is {"custom_id": str, "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions", "body": {...}}; custom_ids are unique within the file. Errors
name their 1-based line number. A line's bytes are located by offset and length,
so the runner reads one request from the stored file without parsing the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rollout_server.fast_json import parse_json

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_CUSTOM_ID_CHARS = 512
MAX_REPORTED_ERRORS = 20


@dataclass(frozen=True)
class InputLine:
    line_no: int         # 1-based
    custom_id: str
    url: str
    byte_offset: int
    byte_length: int


@dataclass(frozen=True)
class LineError:
    line_no: int
    message: str
    param: str | None = None


class BatchInputError(ValueError):
    def __init__(self, errors: list[LineError]):
        self.errors = errors
        shown = "; ".join(f"line {e.line_no}: {e.message}" for e in errors[:MAX_REPORTED_ERRORS])
        more = f" (and {len(errors) - MAX_REPORTED_ERRORS} more errors)" if len(errors) > MAX_REPORTED_ERRORS else ""
        super().__init__(f"Invalid batch input file: {shown}{more}")


def parse_input_file(content: bytes, max_lines: int) -> list[InputLine]:
    """Every request of the file, or BatchInputError listing every bad line."""
    lines: list[InputLine] = []
    errors: list[LineError] = []
    seen_custom_ids: dict[str, int] = {}
    offset = 0
    for line_no, raw in enumerate(content.splitlines(keepends=True), start=1):
        start, offset = offset, offset + len(raw)
        if not raw.strip():
            errors.append(LineError(line_no, "empty line (every line must be one JSON request)"))
            continue
        try:
            line = _parse_line(raw, line_no, start)
        except _LineProblem as problem:
            errors.append(LineError(line_no, problem.message, problem.param))
            continue
        if line.custom_id in seen_custom_ids:
            errors.append(LineError(line_no, f"custom_id {line.custom_id!r} repeats line "
                                             f"{seen_custom_ids[line.custom_id]}", "custom_id"))
            continue
        seen_custom_ids[line.custom_id] = line_no
        lines.append(line)
    if not lines and not errors:
        errors.append(LineError(1, "the file has no requests"))
    if len(lines) + len(errors) > max_lines:
        errors.append(LineError(max_lines + 1, f"the file has more than {max_lines} lines"))
    if errors:
        raise BatchInputError(errors)
    return lines


def read_request_body(content: bytes) -> dict:
    """The body of one line already checked by parse_input_file."""
    return json.loads(content)["body"]


class _LineProblem(Exception):
    def __init__(self, message: str, param: str | None = None):
        self.message = message
        self.param = param


def _parse_line(raw: bytes, line_no: int, offset: int) -> InputLine:
    try:
        request = parse_json(raw)
    except json.JSONDecodeError as exc:
        # exc.lineno counts within this one line, so only the column is meaningful here.
        raise _LineProblem(f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
    except UnicodeDecodeError as exc:
        raise _LineProblem(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except ValueError as exc:
        raise _LineProblem(f"not valid JSON ({exc})") from None
    if not isinstance(request, dict):
        raise _LineProblem("must be a JSON object")
    if _has_lone_surrogate(request):
        raise _LineProblem("holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape that is not half of a pair): "
                           "not text that can be stored or tokenized")
    custom_id = _required(request, "custom_id", str)
    if not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise _LineProblem(f"custom_id must be 1 to {MAX_CUSTOM_ID_CHARS} characters", "custom_id")
    if "\x00" in custom_id:  # stored as text, which PostgreSQL's cannot hold
        raise _LineProblem("custom_id must not contain NUL (\\u0000) characters", "custom_id")
    if _required(request, "method", str) != "POST":
        raise _LineProblem(f"method must be 'POST', not {request['method']!r}", "method")
    url = _required(request, "url", str)
    if url not in BATCH_ENDPOINTS:
        raise _LineProblem(f"url {url!r} is not supported; use one of {', '.join(BATCH_ENDPOINTS)}", "url")
    _required(request, "body", dict)
    unknown = sorted(set(request) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise _LineProblem(f"unknown field {unknown[0]!r}", unknown[0])
    return InputLine(line_no, custom_id, url, offset, len(raw))


def _has_lone_surrogate(request: dict) -> bool:
    try:
        json.dumps(request, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


def _required(request: dict, name: str, kind: type):
    if name not in request:
        raise _LineProblem(f"'{name}' is missing", name)
    value = request[name]
    if not isinstance(value, kind):
        raise _LineProblem(f"'{name}' must be a {'JSON object' if kind is dict else 'string'}", name)
    return value
