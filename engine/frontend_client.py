"""The front door's connection to Dynamo's frontend.

Every generation goes to Dynamo as a token-id prompt on `/v1/completions`, streamed,
with the sampled ids returned as "token_id:N" logprob entries, or, when nobody needs
the logprobs, in Dynamo's `completion_token_ids` field. So the front door knows the
exact prompt ids (it tokenized them) and the exact completion ids (the engine reports
them), whatever the client asked for. Dynamo's KV router picks the worker;
`x-dynamo-session-id` binds a session to the worker holding its KV.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import aiohttp
import msgspec

from engine import stream_interval
from rollout_server.errors import APIError, bad_request, unavailable
from rollout_server.http_headers import header_value

log = logging.getLogger(__name__)

_TOKEN_ID_PREFIX = "token_id:"


@dataclass
class EngineRequest:
    model: str
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: dict                       # OpenAI completion fields passed through (temperature, n, stop, ...)
    top_logprobs: int = 0                # alternatives per position the client wants
    # The sampled tokens' logprobs, which cost the engine a pass over the vocabulary every step. Without them
    # (neither the client nor the traces want them) the ids come alone, for one choice (Dynamo's limit).
    logprobs: bool = True
    # Guided decoding, as Dynamo's completions API takes it: {"guided_json": schema} or {"guided_grammar": ebnf}
    guided: dict = field(default_factory=dict)
    session_id: str | None = None
    prompt_param: str = "prompt"         # the client's field that held the prompt (named in errors)
    pool: str = "default"                # the capacity pool that serves it (engine/pools.py)
    stream_interval: int = 1             # tokens the worker gathers per message (vLLM's per-request stream_interval)
    cache_salt: str | None = None        # only requests with the same salt share cached KV


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None                # None: not asked of the engine (EngineRequest.logprobs)
    top: list[tuple[int, float]]


@dataclass
class ChoiceDelta:
    index: int
    text: str
    tokens: list[SampledToken]
    finish_reason: str | None


@dataclass
class EngineUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class EngineChunk:
    deltas: list[ChoiceDelta]
    usage: EngineUsage | None = None
    worker_id: str | None = None
    received_at: float = 0.0
    final: bool = False                  # every choice has finished and the usage is known: the answer is whole


def _parse_token_id(entry: str) -> int:
    if not entry.startswith(_TOKEN_ID_PREFIX):
        raise ValueError(f"engine returned a token without its id: {entry!r}")
    return int(entry[len(_TOKEN_ID_PREFIX):])


def _parse_choice(choice: dict, token_ids: list[int] | None, top_logprobs: int) -> ChoiceDelta:
    """One choice of a chunk; `token_ids`: its ids when they came without logprobs. Alternatives are read
    only when asked for. A position without them held the sampled token alone (our worker leaves such lists
    out: engine/dynamo_worker.py), so with alternatives asked for, the sampled token was the most likely."""
    if token_ids is not None:
        tokens = [SampledToken(token_id, None, []) for token_id in token_ids]
        return ChoiceDelta(choice.get("index", 0), choice.get("text") or "", tokens, choice.get("finish_reason"))
    logprobs = choice.get("logprobs") or {}
    sampled = zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [])
    if not top_logprobs:  # the default: every streamed token passes here
        tokens = [SampledToken(_parse_token_id(tok), float(lp), []) for tok, lp in sampled]
    else:
        tops = logprobs.get("top_logprobs") or []
        tokens = []
        for i, (tok, lp) in enumerate(sampled):
            alternatives = tops[i] if i < len(tops) and tops[i] else {tok: lp}
            top = sorted(((_parse_token_id(t), float(v)) for t, v in alternatives.items()), key=lambda p: -p[1])
            tokens.append(SampledToken(_parse_token_id(tok), float(lp), top))
    return ChoiceDelta(choice.get("index", 0), choice.get("text") or "", tokens, choice.get("finish_reason"))


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
                       str(worker) if worker is not None else None, time.monotonic())


def engine_error(status: int, body: dict, request: EngineRequest) -> APIError:
    """Dynamo's error body -> the OpenAI error the client should see."""
    details = body.get("details") or {}
    message = body.get("message") or body.get("error") or "engine error"
    if details.get("type") == "context_length":
        return bad_request(
            f"This model's maximum context length is {details.get('limit')} tokens. However, you requested "
            f"{details.get('actual')} tokens ({len(request.prompt_token_ids)} in the prompt, "
            f"{request.max_tokens} for the completion).", param=request.prompt_param, code="context_length_exceeded")
    if status == 404:
        # The front door checked the model; Dynamo forgets a model when its last worker goes away.
        return unavailable(f"no worker is serving {request.model} right now ({message}); retry shortly")
    if 400 <= status < 500:
        return APIError(status, str(message), param=None)
    return unavailable(f"the engine could not serve the request: {message}")


class RefusedBeforeOutput(Exception):
    """The request never reached Dynamo, Dynamo answered 503, or the stream failed before any token:
    nothing was generated, so sending it again (to the same deployment or another) is safe."""

    def __init__(self, error: APIError):
        self.error = error


class DynamoFrontendClient:
    """The front door's connection to one Dynamo frontend (one deployment).

    `stream_once` sends a request once. A failure before any token (no connection within the connect
    timeout, a 503, a worker that died before its first token) raises `RefusedBeforeOutput`, which the
    caller (engine/routing.py) may send again; a failure after tokens started is an `APIError`.
    """

    def __init__(self, base_url: str, timeout_s: float = 600.0,
                 connector: Callable[[], aiohttp.BaseConnector] | None = None):
        self.base_url = base_url
        self.route = f"Dynamo frontend {base_url}"
        # aiohttp, not httpx: its C HTTP parser takes ~1/4 of httpx's CPU per streamed chunk and ~1/5 per
        # request (docs/benchmarks.md, "Front door"), on the path every token takes.
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
            **{k: v for k, v in req.sampling.items() if v is not None},
            **req.guided,
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
        produced = False
        try:
            async for chunk in self._stream(req):
                produced = produced or any(d.tokens for d in chunk.deltas)
                yield chunk
        except APIError as error:
            if produced or error.status != 503:
                raise
            raise RefusedBeforeOutput(error) from None

    async def _stream(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        headers = {"x-request-id": header_value(req.request_id), "content-type": "application/json"}
        if req.session_id:
            headers["x-dynamo-session-id"] = header_value(req.session_id)[:256]
        # msgspec, not aiohttp's json.dumps: a 140k-token prompt encodes in 0.7 ms instead of 12 ms of event loop
        body = msgspec.json.encode(self._body(req))
        resp = None
        try:
            resp = await self._http().post("/v1/completions", data=body, headers=headers)
            _acknowledge_promptly(resp)
            if resp.status != 200:
                raw = await resp.read()
                error = engine_error(resp.status, _json_or_message(raw), req)
                raise RefusedBeforeOutput(error) if resp.status == 503 else error
            chunks = _sse_chunks(resp.content, req.top_logprobs, choices=req.sampling.get("n", 1))
            async for chunk in chunks:
                if chunk.final:
                    self._read_to_the_end_later(chunks, resp, req.request_id)
                    resp = None
                    yield chunk
                    return
                yield chunk
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # the request was never sent
            raise RefusedBeforeOutput(unavailable(
                f"the engine is unreachable ({exc.__class__.__name__}); retry shortly")) from exc
        except (aiohttp.SocketTimeoutError, asyncio.TimeoutError) as exc:
            raise APIError(504, f"the engine did not answer within the request timeout ({exc.__class__.__name__})") from exc
        except aiohttp.ClientError as exc:
            raise unavailable(f"the engine connection failed ({exc.__class__.__name__}); retry shortly") from exc
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
    return req.logprobs or req.top_logprobs > 0 or req.sampling.get("n", 1) > 1


def _acknowledge_promptly(resp: aiohttp.ClientResponse) -> None:
    """Acknowledge the response's segments as they arrive, not up to 40 ms later.

    Dynamo's frontend (Rust, hyper) leaves Nagle's algorithm on, so it holds its next small write (the first
    token's event, right after the headers) until the client acknowledges the previous one. Linux delays that
    acknowledgement on a keep-alive connection that looks like request/response, hoping to piggyback it on the
    next request: every streamed request waited ~20 ms for its first token. TCP_QUICKACK sends the pending
    acknowledgement now and leaves that mode for the rest of the response (a 1-token request through the
    front door on an idle stack: 52 -> 28-32 ms).
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


def _stream_error(payload: dict) -> APIError:
    """An error event in Dynamo's stream: a 4xx code is the request's own fault (not worth a retry),
    anything else the engine's."""
    message = payload.get("error") or payload.get("message") or payload
    code = payload.get("code")
    if isinstance(code, int) and 400 <= code < 500:
        return APIError(code, f"the engine refused the request: {message}")
    return unavailable(f"the engine failed mid-request: {message}")


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
    raise unavailable("the engine's stream ended before the request finished (its worker may have died)")
