"""JSON in and out of the front door with msgspec instead of the standard library's json.

A token-in/token-out request carries its prompt as a JSON list of ids, and its response echoes them.
They are parsed and written on the front door's event loop, where that time holds every stream, and msgspec
parses and (above all) writes a long list of ids in a fraction of the standard library's time
(docs/benchmarks.md, "Measurements behind design choices"). Malformed bodies still raise
`json.JSONDecodeError`, which FastAPI turns into the validation error the front door answers with a 400
naming the problem.

Bodies over the size limit are refused with a 413 before they are read to the end: a 60 MB prompt would
otherwise be read, parsed and tokenized only to be refused as over the context.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

_BYTE_POSITION = re.compile(r"\(byte (\d+)\)")


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


def msgspec_route(max_body_bytes: int) -> type[APIRoute]:
    """A route class whose handlers read JSON bodies of up to `max_body_bytes` with msgspec."""
    class MsgspecRoute(APIRoute):
        def get_route_handler(self):
            handle = super().get_route_handler()

            async def handle_with_msgspec(request: Request):
                limited = MsgspecRequest(request.scope, request.receive)
                limited.max_body_bytes = max_body_bytes
                return await handle(limited)

            return handle_with_msgspec

    return MsgspecRoute


class MsgspecJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)
