"""The front door's connection to Dynamo's frontend over HTTP (an `EngineClient`, engine/contract.py).

Every generation goes to Dynamo as a token-id prompt on `/v1/completions`, streamed, with the sampled ids
returned as "token_id:N" logprob entries, or, when nobody needs the logprobs, in Dynamo's
`completion_token_ids` field. Dynamo's KV router picks the worker; `x-dynamo-session-id` binds a session to
the worker holding its KV (engine/sessions.py).

This path serves what the router inside the front door does not (engine/client/embedded_router.py):
disaggregated deployments (Dynamo's prefill router) and the round-robin and random router modes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import AsyncIterator, Callable

import aiohttp
import msgspec

from engine import stream_interval
from engine.contract import ChoiceDelta, EngineChunk, EngineRequest, EngineUsage, sampled_tokens
from engine.errors import (
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    RefusedBeforeOutput,
    RequestRejected,
    error_from_dynamo,
)
from engine.http_headers import header_value
from engine.ids import WorkerId
from engine.sessions import dynamo_session_header

log = logging.getLogger(__name__)

_TOKEN_ID_PREFIX = "token_id:"


def _parse_token_id(entry: str) -> int:
    if not entry.startswith(_TOKEN_ID_PREFIX):
        raise ValueError(f"engine returned a token without its id: {entry!r}")
    return int(entry[len(_TOKEN_ID_PREFIX):])


def _parse_choice(choice: dict, token_ids: list[int] | None, top_logprobs: int) -> ChoiceDelta:
    """One choice of a chunk; `token_ids`: its ids when they came without logprobs."""
    text, finish = choice.get("text") or "", choice.get("finish_reason")
    if token_ids is not None:
        return ChoiceDelta(choice.get("index", 0), text, sampled_tokens(token_ids, None, (), 0), finish)
    logprobs = choice.get("logprobs") or {}
    ids = [_parse_token_id(token) for token in logprobs.get("tokens") or []]
    alternatives = [[(_parse_token_id(t), v) for t, v in top.items()] if top else None
                    for top in logprobs.get("top_logprobs") or []] if top_logprobs else ()
    tokens = sampled_tokens(ids, logprobs.get("token_logprobs") or [], alternatives, top_logprobs)
    return ChoiceDelta(choice.get("index", 0), text, tokens, finish)


def _parse_chunk(payload: dict, top_logprobs: int) -> EngineChunk:
    usage = None
    if payload.get("usage"):
        u = payload["usage"]
        details = u.get("prompt_tokens_details") or {}
        usage = EngineUsage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0), details.get("cached_tokens") or 0)
    nvext = payload.get("nvext") or {}
    worker = (nvext.get("worker_id") or {}).get("decode_worker_id")
    token_ids = nvext.get("completion_token_ids")  # only for one choice: _asks_for_logprobs
    return EngineChunk([_parse_choice(c, token_ids, top_logprobs) for c in payload.get("choices", [])], usage,
                       WorkerId(int(worker)) if worker is not None else None, time.monotonic())


class DynamoFrontendClient:
    """The front door's connection to one Dynamo frontend (one deployment).

    A failure before any token (no connection within the connect timeout, a 503, a worker that died before
    its first token) raises `RefusedBeforeOutput`; a failure after tokens started is an `EngineError`.
    """

    def __init__(self, base_url: str, timeout_s: float = 600.0,
                 connector: Callable[[], aiohttp.BaseConnector] | None = None):
        self.base_url = base_url
        self.via = f"Dynamo frontend {base_url}"
        # aiohttp, not httpx: its C HTTP parser costs a fraction of httpx's CPU per streamed chunk, on the path
        # every token takes (docs/benchmarks.md, "Measurements behind design choices").
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout_s)
        self.connector = connector or (lambda: aiohttp.TCPConnector(limit=1024))  # made per session
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task] = set()  # streams answered, read to their end (_read_to_the_end_later)

    def _http(self) -> aiohttp.ClientSession:
        """The session of the running event loop (a session cannot outlive its loop), made on first use."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # read_bufsize: an SSE line may be up to twice this (a whole response's message with top logprobs)
            self._session = aiohttp.ClientSession(self.base_url, timeout=self.timeout, connector=self.connector(),
                                                  read_bufsize=2**20)
            self._session_loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._session_loop is asyncio.get_running_loop():
            for task in self._closing:
                task.cancel()
            await asyncio.gather(*self._closing, return_exceptions=True)
            await self._session.close()
        self._session = None

    def _body(self, req: EngineRequest) -> dict:
        body = {
            **req.sampling.given(),
            **({f"guided_{req.guided.kind}": req.guided.spec} if req.guided else {}),
            "model": req.model,
            "prompt": req.prompt_token_ids,
            "max_tokens": req.max_tokens,
            "stream": True,
            # The usage in every chunk, so the one that ends the last choice has it too (`EngineChunk.final`)
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "nvext": {"extra_fields": ["worker_id"]},
        }
        if _asks_for_logprobs(req):
            body["logprobs"] = req.top_logprobs  # 0 still returns the sampled token id and its logprob
            body["return_tokens_as_token_ids"] = True
        else:
            body["nvext"]["extra_fields"].append("completion_token_ids")
        if req.stream_interval > 1:
            body["nvext"]["annotations"] = [stream_interval.annotation(req.stream_interval)]
        if req.cache_salt:
            body["nvext"]["cache_salt"] = req.cache_salt
        return body

    async def stream_once(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        if req.allowed_workers is not None:
            raise RequestRejected(409, "min_policy_version: this deployment's workers run different policy versions "
                                       "(a rolling update), and requests reach them through Dynamo's frontend, "
                                       "which cannot place a request on chosen workers; retry after the update")
        produced = False
        try:
            async for chunk in self._stream(req):
                produced = produced or any(d.tokens for d in chunk.deltas)
                yield chunk
        except EngineUnavailable as error:
            if produced:
                raise
            raise RefusedBeforeOutput(error) from None

    async def _stream(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        headers = {"x-request-id": header_value(req.request_id), "content-type": "application/json",
                   **dynamo_session_header(req.session_id)}
        # msgspec, not aiohttp's json.dumps: a long prompt's ids take a fraction of the event loop's time
        body = msgspec.json.encode(self._body(req))
        resp = None
        try:
            resp = await self._http().post("/v1/completions", data=body, headers=headers)
            _acknowledge_promptly(resp)
            if resp.status != 200:
                raw = await resp.read()
                error = error_from_dynamo(resp.status, _json_or_message(raw), req.model)
                raise RefusedBeforeOutput(error) if resp.status == 503 else error
            chunks = _sse_chunks(resp.content, req.top_logprobs, choices=req.sampling.n)
            async for chunk in chunks:
                if chunk.final:
                    self._read_to_the_end_later(chunks, resp, req.request_id)
                    resp = None
                    yield chunk
                    return
                yield chunk
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # the request was never sent
            raise RefusedBeforeOutput(EngineUnavailable(
                f"the engine is unreachable ({exc.__class__.__name__}); retry shortly")) from exc
        except (aiohttp.SocketTimeoutError, asyncio.TimeoutError) as exc:
            raise EngineTimeout(f"the engine did not answer within the request timeout ({exc.__class__.__name__})") from exc
        except aiohttp.ClientError as exc:
            raise EngineUnavailable(f"the engine connection failed ({exc.__class__.__name__}); retry shortly") from exc
        finally:
            if resp is not None:
                resp.release()  # read to its end: back to the pool; cut short: closed

    def _read_to_the_end_later(self, rest: AsyncIterator[EngineChunk], resp: aiohttp.ClientResponse,
                               request_id: str) -> None:
        """Once every choice has finished and the usage is known, what is left of Dynamo's stream is its
        closing: a usage-only chunk and `[DONE]`, which Dynamo's frontend sends once its worker has closed the
        request's stream, often several milliseconds later under load. The request is answered without
        them; they are read off its way, so that the connection goes back to the pool whole."""
        task = asyncio.get_running_loop().create_task(_read_to_the_end(rest, resp, request_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


async def _read_to_the_end(rest: AsyncIterator[EngineChunk], resp: aiohttp.ClientResponse, request_id: str) -> None:
    try:
        async for _ in rest:
            pass
    except Exception as exc:  # the request has had its answer; only the connection is lost
        log.warning("request %s: the engine's stream failed after its last token: %r", request_id, exc)
    finally:
        resp.release()


def _asks_for_logprobs(req: EngineRequest) -> bool:
    """Whether the ids come as logprob entries: when logprobs are wanted, and for several choices (Dynamo's
    `completion_token_ids` holds one choice's ids)."""
    return req.logprobs or req.top_logprobs > 0 or req.sampling.n > 1


def _acknowledge_promptly(resp: aiohttp.ClientResponse) -> None:
    """Acknowledge the response's segments as they arrive, not up to 40 ms later.

    Dynamo's frontend (Rust, hyper) leaves Nagle's algorithm on, so it holds its next small write (the first
    token's event, right after the headers) until the client acknowledges the previous one. Linux delays that
    acknowledgement on a keep-alive connection that looks like request/response, hoping to piggyback it on the
    next request, so a streamed request's first token waits for that delayed acknowledgement. TCP_QUICKACK
    sends the pending acknowledgement now and leaves that mode for the rest of the response
    (docs/benchmarks.md, "Measurements behind design choices").
    """
    transport = resp.connection.transport if resp.connection else None
    sock = transport.get_extra_info("socket") if transport else None
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):  # Linux only
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


async def _sse_events(body: aiohttp.StreamReader) -> AsyncIterator[tuple[str | None, bytes]]:
    """(event name, data) of each data line of a server-sent event stream.

    Reads whatever bytes have arrived and splits the events itself: one await per network read, usually one
    event, where reading line by line takes three (the data line, the blank line, the next)."""
    pending = b""
    async for piece in body.iter_any():
        pending = (pending + piece).replace(b"\r\n", b"\n")
        *events, pending = pending.split(b"\n\n")
        for block in events:
            name = None
            for line in block.split(b"\n"):
                if line.startswith(b"event:"):
                    name = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    yield name, line[5:].strip()


def _json_or_message(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
        return body if isinstance(body, dict) else {"message": str(body)}
    except ValueError:
        return {"message": raw.decode(errors="replace")[:500]}


def _stream_error(payload: dict) -> EngineError:
    """An error event in Dynamo's stream: a 4xx code is the request's own fault (not worth a retry),
    anything else the engine's."""
    message = payload.get("error") or payload.get("message") or payload
    code = payload.get("code")
    if isinstance(code, int) and 400 <= code < 500:
        return RequestRejected(code, f"the engine refused the request: {message}")
    return EngineUnavailable(f"the engine failed mid-request: {message}")


async def _sse_chunks(body: aiohttp.StreamReader, top_logprobs: int, choices: int = 1) -> AsyncIterator[EngineChunk]:
    """The stream's chunks; `choices`: how many the request asked for (n), to mark the chunk that ends the last."""
    finished: set[int] = set()
    async for event, data in _sse_events(body):
        if data == b"[DONE]":
            return
        payload = msgspec.json.decode(data)  # the per-token hot path: msgspec is several times faster than json
        if event == "error" or "error" in payload or ("message" in payload and "choices" not in payload):
            raise _stream_error(payload)
        chunk = _parse_chunk(payload, top_logprobs)
        finished.update(delta.index for delta in chunk.deltas if delta.finish_reason)
        chunk.final = len(finished) == choices and chunk.usage is not None
        yield chunk
    raise EngineUnavailable("the engine's stream ended before the request finished (its worker may have died)")
