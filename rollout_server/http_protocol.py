"""The front door's HTTP/1.1 protocol: uvicorn's httptools protocol, whose refusal of a request it cannot
parse (a control character in a header value, a malformed request line) is an OpenAI error JSON saying
what the parser found, instead of uvicorn's plain-text "Invalid HTTP request received."

Such a request never reaches the app, so the app's error handlers cannot shape this answer.
"""

from __future__ import annotations

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
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.parser = _ParserKeepingItsError(self.parser)

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
