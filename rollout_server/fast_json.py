"""JSON in and out of the front door with msgspec instead of the standard library's json.

A token-in/token-out request carries its prompt as a JSON list of ids, and its response echoes them.
They are parsed and written on the front door's event loop, where that time holds every stream, and msgspec
parses and (above all) writes a long list of ids in a fraction of the standard library's time
(docs/benchmarks.md, "Measurements behind design choices"). Malformed bodies still raise
`json.JSONDecodeError`, which FastAPI turns into the validation error the front door answers with a 400
naming the problem.

Bodies over the size limit are refused with a 413 before they are read to the end: a 60 MB prompt would
otherwise be read, parsed and tokenized only to be refused as over the context. Bodies nested deeper than the
depth limit (setting limits_max_json_depth) are refused with a 400 before they are parsed: code that walks a
value recursively (validation, trace redaction) fails on a deep one, far from the request that sent it.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

import msgspec
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

_BYTE_POSITION = re.compile(r"\(byte (\d+)\)")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NESTING_STEP = [{ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(b, 0) for b in range(256)]


def json_depth_over(raw: bytes, most: int) -> int | None:
    """How deep the JSON text `raw` nests objects and arrays, if deeper than `most`; else None.

    Read on the bytes, before parsing: a body with no more than `most` brackets cannot nest deeper (the usual
    case, a count in C). Otherwise the brackets inside strings are dropped (escaped backslashes and quotes
    first, so that every quote left opens or closes a string) and the nesting of the rest is summed."""
    if raw.count(b"[") + raw.count(b"{") <= most:
        return None
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[0::2]).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0)
    return depth if depth > most else None


def parse_json(raw: bytes) -> Any:
    """JSON from a body read by hand. Anything that is not JSON text raises a ValueError saying why: bad syntax
    (json.JSONDecodeError), bytes that are not UTF-8 (UnicodeDecodeError), or nesting deeper than the parser
    recurses (a RecursionError otherwise, which no route expects)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


class MsgspecRequest(Request):
    max_body_bytes: int  # set by the route (settings.server.max_request_body_mib)
    max_json_depth: int | None = None  # set by the route (settings.limits.max_json_depth); None: not checked

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            declared = self.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise self._too_large()
            chunks, size = [], 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > self.max_body_bytes:  # sent without a Content-Length, or with a false one
                    raise self._too_large()
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            depth = json_depth_over(body, self.max_json_depth) if self.max_json_depth is not None else None
            if depth is not None:  # as JSON no parser here reads: the 400 of malformed JSON, saying why
                raise json.JSONDecodeError(f"nested {depth} levels deep; this server accepts at most "
                                           f"{self.max_json_depth} (setting limits_max_json_depth)", "", 0)
            try:
                self._json = msgspec.json.decode(body)
            except msgspec.DecodeError as exc:
                position = _BYTE_POSITION.search(str(exc))
                raise json.JSONDecodeError(str(exc), body.decode(errors="replace"),
                                           int(position.group(1)) if position else 0) from None
            except RecursionError:  # as parse_json, in the error FastAPI turns into a 400
                raise json.JSONDecodeError("nested too deeply", "", 0) from None
        return self._json

    def _too_large(self) -> HTTPException:
        # An HTTPException: FastAPI turns any other error while it reads the body into a 400.
        return HTTPException(413, f"The request body is larger than this server accepts ({self.max_body_bytes} "
                                  f"bytes; setting max_request_body_mib).")


def msgspec_route(max_body_bytes: int, max_json_depth: int | None = None) -> type[APIRoute]:
    """A route class whose handlers read JSON bodies of up to `max_body_bytes`, nested up to `max_json_depth`,
    with msgspec."""
    class MsgspecRoute(APIRoute):
        def get_route_handler(self):
            handle = super().get_route_handler()

            async def handle_with_msgspec(request: Request):
                limited = MsgspecRequest(request.scope, request.receive)
                limited.max_body_bytes = max_body_bytes
                limited.max_json_depth = max_json_depth
                return await handle(limited)

            return handle_with_msgspec

    return MsgspecRoute


class MsgspecJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)
