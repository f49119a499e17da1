"""The OpenAI Batch API routes over a BatchStore.

    POST /v1/files                    multipart: file=<JSONL>, purpose=batch (the one purpose, the default)
    GET  /v1/files/{id}               the file object
    GET  /v1/files/{id}/content       the bytes (input, output or error file)
    POST /v1/batches                  {"input_file_id", "endpoint", "completion_window": "24h", "metadata"?}
    GET  /v1/batches                  the team's batches, newest first (?limit=&after=)
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel

A team sees only its own files and batches: anything else is a 404.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import pydantic
from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from fastapi.responses import FileResponse

from rollout_server.auth import Principal
from rollout_server.batch_input import BATCH_ENDPOINTS
from rollout_server.batch_runner import BatchRunner
from rollout_server.batches import COMPLETION_WINDOWS, INPUT_PURPOSE, BatchStore
from rollout_server.errors import APIError, error_responses
from rollout_server.openapi import DocumentedModel

_READ_CHUNK_BYTES = 1 << 20

# The uploaded file's part: a file (a filename in its header) of JSONL, one request per line, as
# rollout_server/batch_input.py reads them; what its lines hold, no JSON schema of a file can say.
_INPUT_FILE = {"format": "binary", "contentMediaType": "application/jsonl",
               "description": 'JSONL: {"custom_id", "method": "POST", "url", "body"} per line, custom_ids unique'}
_INPUT_FILE_ENCODING = {"requestBody": {"content": {"multipart/form-data": {
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

    @router.post("/v1/files", responses=error_responses(400, 401, 413), openapi_extra=_INPUT_FILE_ENCODING)
    async def upload_file(file: UploadFile = File(json_schema_extra=_INPUT_FILE),
                          purpose: str = Form(INPUT_PURPOSE, json_schema_extra={"enum": [INPUT_PURPOSE]}),
                          who: Principal = Depends(principal_dependency)):
        content = await _read_at_most(file, max_file_bytes)
        stored = await asyncio.to_thread(store.save_input_file, who.team, file.filename or "input.jsonl",
                                         purpose, content)
        return stored.to_json()

    @router.get("/v1/files/{file_id}", responses=error_responses(401, 404))
    async def get_file(file_id: str, who: Principal = Depends(principal_dependency)):
        return (await asyncio.to_thread(store.get_file, file_id, who.team)).to_json()

    @router.get("/v1/files/{file_id}/content", response_class=FileResponse,
                responses={200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}},
                           **error_responses(401, 404)})
    async def file_content(file_id: str, who: Principal = Depends(principal_dependency)):
        stored = await asyncio.to_thread(store.get_file, file_id, who.team)
        return FileResponse(store.path_of(stored.id), media_type="application/jsonl", filename=stored.filename)

    @router.post("/v1/batches", responses=error_responses(400, 401, 404, 413))
    async def create_batch(body: CreateBatchBody, who: Principal = Depends(principal_dependency)):
        batch = await asyncio.to_thread(store.create_batch, who.team, body.input_file_id, body.endpoint,
                                        body.completion_window, body.metadata)
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


async def _read_at_most(upload: UploadFile, max_bytes: int) -> bytes:
    chunks, size = [], 0
    while chunk := await upload.read(_READ_CHUNK_BYTES):
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"File too large: the limit is {max_bytes} bytes.", param="file",
                           code="file_too_large")
        chunks.append(chunk)
    return b"".join(chunks)
