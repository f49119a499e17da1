"""The front door's HTTP/1.1 protocol: uvicorn's httptools protocol, whose refusal of a request it cannot
parse (a control character in a header value, a malformed request line) is an OpenAI error JSON saying
what the parser found, instead of uvicorn's plain-text "Invalid HTTP request received."

Such a request never reaches the app, so the app's error handlers cannot shape this answer.

And a request's headers arrive in time: uvicorn waits for them as long as a client likes, so a connection that
sends nothing, or its headers a byte at a time, would hold one of the server's `max_connections` for ever. A
connection's first request must have its headers whole within `headers_timeout_s` of the connection opening, and
every later one within that time of its first byte; else the connection is closed. (Between requests uvicorn's
keep-alive timeout closes an idle connection; a body has its own deadline, rollout_server/body_deadline.py.)
"""

from __future__ import annotations

import asyncio
import json

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from rollout_server.errors import bad_request


class _ParserKeepingItsError:
    """httptools' request parser, remembering why it refused the bytes (uvicorn keeps only that it did)."""

    def __init__(self, parser: httptools.HttpRequestParser):
        self._parser = parser
        self.error: str | None = None

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:  # not HttpParserUpgrade, which is no parse error
            self.error = str(error)
            raise

    def __getattr__(self, name: str):
        return getattr(self._parser, name)


class HttpProtocol(HttpToolsProtocol):
    def __init__(self, *args, headers_timeout_s: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.parser = _ParserKeepingItsError(self.parser)
        self.headers_timeout_s = headers_timeout_s
        self._headers_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect_headers()  # a first request's headers stay due from the connection's opening

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def _expect_headers(self) -> None:
        if self.headers_timeout_s is not None and self._headers_due is None:
            self._headers_due = self.loop.call_later(self.headers_timeout_s, self._headers_too_late)

    def _headers_arrived(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_too_late(self) -> None:
        self._headers_due = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        detail = self.parser.error or "malformed request"
        if "header" in detail.lower():
            detail += " (a header's name or value holds a character HTTP does not allow, such as a control character)"
        body = json.dumps(bad_request(f"Invalid HTTP request: {detail}.", code="invalid_http_request").body()).encode()
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n", b"\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
