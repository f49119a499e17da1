"""The OpenAI Batch API routes over a BatchStore.

    POST /v1/files                    multipart: file=<JSONL>, purpose=batch (the one purpose, the default)
    GET  /v1/files/{id}               the file object
    GET  /v1/files/{id}/content       the bytes (input, output or error file)
    POST /v1/batches                  {"input_file_id", "endpoint", "completion_window": "24h", "metadata"?}
    GET  /v1/batches                  the team's batches, newest first (?limit=&after=)
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel

A team sees only its own files and batches: anything else is a 404, and so is a file the retention sweep removed
(rollout_server/batches.py): its content is sent from the handle opened before, so a sweep meanwhile changes nothing.

An upload is read as it arrives, its file kept in memory and nowhere else: the moment the file grows past
`max_file_bytes` the upload is refused (413 naming `file`) and nothing more of it is read; the form's other bytes
(part headers, boundaries, `purpose`) may add at most `_FORM_BYTES`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO
from urllib.parse import quote

import pydantic
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, StreamingResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from rollout_server.auth import Principal
from rollout_server.batch_input import BATCH_ENDPOINTS
from rollout_server.batch_runner import BatchRunner
from rollout_server.batches import COMPLETION_WINDOWS, INPUT_PURPOSE, BatchStore
from rollout_server.errors import APIError, bad_request, error_responses
from rollout_server.openapi import DocumentedModel

_FORM_BYTES = 64 * 2**10  # what an upload may hold besides its file's bytes
_FORM_FIELDS = ("file", "purpose")

# The form: a file of JSONL, one request per line, as rollout_server/batch_input.py reads them (what its lines
# hold, no JSON schema of a file can say), and its purpose.
_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"title": "UploadFileBody", "type": "object", "required": ["file"], "properties": {
        "file": {"title": "File", "type": "string", "format": "binary", "contentMediaType": "application/jsonl",
                 "description": 'JSONL: {"custom_id", "method": "POST", "url", "body"} per line, custom_ids unique'},
        "purpose": {"title": "Purpose", "type": "string", "enum": [INPUT_PURPOSE], "default": INPUT_PURPOSE}}},
    "encoding": {"file": {"contentType": "application/jsonl"}}}}}}


class CreateBatchBody(DocumentedModel):
    input_file_id: str
    # The store checks these two (its 400 names the values it takes); the schema lists them
    endpoint: str = pydantic.Field(json_schema_extra={"enum": list(BATCH_ENDPOINTS)})
    completion_window: str = pydantic.Field(json_schema_extra={"enum": list(COMPLETION_WINDOWS)})
    metadata: dict[str, str] | None = None


def batches_router(store: BatchStore, principal_dependency: Callable[..., Principal],
                   runner: BatchRunner | None = None, max_file_bytes: int = 200 * 2**20) -> APIRouter:
    router = APIRouter()

    def wake_runner() -> None:
        if runner is not None:
            runner.wake()

    @router.post("/v1/files", responses=error_responses(400, 401, 413), openapi_extra=_UPLOAD_BODY)
    async def upload_file(request: Request, who: Principal = Depends(principal_dependency)):
        form = await _read_upload(request, max_file_bytes)
        stored = await asyncio.to_thread(store.save_input_file, who.team, form.filename or "input.jsonl",
                                         form.purpose, form.content)
        return stored.to_json()

    @router.get("/v1/files/{file_id}", responses=error_responses(401, 404))
    async def get_file(file_id: str, who: Principal = Depends(principal_dependency)):
        return (await asyncio.to_thread(store.get_file, file_id, who.team)).to_json()

    @router.get("/v1/files/{file_id}/content", response_class=FileResponse,
                responses={200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}},
                           **error_responses(401, 404)})
    async def file_content(file_id: str, who: Principal = Depends(principal_dependency)):
        stored, content = await asyncio.to_thread(store.open_content, file_id, who.team)
        return StreamingResponse(_chunks(content), media_type="application/jsonl", headers={
            "Content-Length": str(os.fstat(content.fileno()).st_size),
            "Content-Disposition": f"attachment; filename*=utf-8''{quote(stored.filename)}"})

    @router.post("/v1/batches", responses=error_responses(400, 401, 404, 413))
    async def create_batch(body: CreateBatchBody, who: Principal = Depends(principal_dependency)):
        batch = await asyncio.to_thread(store.create_batch, who.team, body.input_file_id, body.endpoint,
                                        body.completion_window, body.metadata, who.key_prefix)
        wake_runner()
        return batch

    @router.get("/v1/batches", responses=error_responses(400, 401, 404))
    async def list_batches(limit: int = Query(20, ge=1, le=100), after: str | None = None,
                           who: Principal = Depends(principal_dependency)):
        return await asyncio.to_thread(store.list_batches, who.team, limit, after)

    @router.get("/v1/batches/{batch_id}", responses=error_responses(401, 404))
    async def get_batch(batch_id: str, who: Principal = Depends(principal_dependency)):
        return await asyncio.to_thread(store.get_batch, batch_id, who.team)

    @router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(400, 401, 404))
    async def cancel_batch(batch_id: str, who: Principal = Depends(principal_dependency)):
        batch = await asyncio.to_thread(store.cancel_batch, batch_id, who.team)
        wake_runner()
        return batch

    return router


class _UploadForm:
    """The parts of a multipart/form-data upload as python-multipart's parser hands them over: the bytes of each
    field by name, the `file` field's counted as they come (`max_file_bytes`: the 413)."""

    def __init__(self, max_file_bytes: int):
        self.max_file_bytes = max_file_bytes
        self.parts: dict[str, list[bytes]] = {}
        self.filename: str | None = None
        self._file_bytes = 0
        self._header = b""
        self._value = b""
        self._disposition = b""
        self._part: list[bytes] = []
        self._is_file = False

    def callbacks(self) -> dict:
        return {"on_part_begin": self._begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._data}

    def _begin(self) -> None:
        self._disposition = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        if self._header.lower() == b"content-disposition":
            self._disposition = self._value
        self._header = self._value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name", b"").decode(errors="replace")
        if name not in _FORM_FIELDS:
            self._part, self._is_file = [], False  # a field the upload does not take: read (within the form's
            return                                  # bytes) and dropped, as a form model drops unknown fields
        if name in self.parts:
            raise bad_request(f"The form holds '{name}' twice: one file per upload.", param=name, code="invalid_value")
        self._part = self.parts[name] = []
        self._is_file = name == "file"
        if self._is_file and b"filename" in options:
            self.filename = options[b"filename"].decode(errors="replace")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self._file_bytes += end - start
            if self._file_bytes > self.max_file_bytes:
                raise _file_too_large(self.max_file_bytes)
        self._part.append(data[start:end])

    @property
    def content(self) -> bytes:
        if "file" not in self.parts:
            raise bad_request("The form has no 'file' field: upload the JSONL file as 'file'.", param="file",
                              code="missing_required_parameter")
        return b"".join(self.parts["file"])

    @property
    def purpose(self) -> str:
        return b"".join(self.parts.get("purpose", [INPUT_PURPOSE.encode()])).decode(errors="replace")


async def _read_upload(request: Request, max_file_bytes: int) -> _UploadForm:
    """The upload's form, read as it arrives (module docstring)."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    if kind != b"multipart/form-data" or b"boundary" not in options:
        raise bad_request("Upload the file as multipart/form-data, in a field named 'file'.", param="file",
                          code="invalid_value")
    limit = max_file_bytes + _FORM_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:  # refused before a byte is read
        raise _file_too_large(max_file_bytes)
    form = _UploadForm(max_file_bytes)
    parser = MultipartParser(options[b"boundary"], form.callbacks())
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _file_too_large(max_file_bytes)
            parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise bad_request(f"The multipart form is malformed: {exc}", param="file", code="invalid_value") from None
    except ClientDisconnect:  # gone, or its body not in time (rollout_server/body_deadline.py): nobody reads this
        raise bad_request("The upload ended before its last byte.", param="file", code="invalid_value") from None
    return form


def _chunks(content: BinaryIO, size: int = 2**16) -> Iterator[bytes]:
    with content:
        while chunk := content.read(size):
            yield chunk


def _file_too_large(max_file_bytes: int) -> APIError:
    return APIError(413, f"File too large: the limit is {max_file_bytes} bytes (setting batches_max_file_bytes).",
                    param="file", code="file_too_large")
