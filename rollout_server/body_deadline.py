"""A request's body arrives in time, or its connection is closed; a refusal sent before the body closes it too.

uvicorn waits for a body as long as its client likes: a client that sends its headers and then its body a byte
at a time, or never, holds a connection and a task for nothing. So the body of every request must arrive whole
within `server.body_timeout_s` of the request reaching the app. Past that the request is answered 408 (unless
its response has started), its connection is closed, and the app, still reading, sees the client gone: any
answer it writes afterwards goes nowhere.

A response that starts before its request's body was read to the end (a refusal: no key, a body too large)
says `Connection: close`: otherwise the server would go on receiving, and throwing away, a body nobody reads.

Requests without a body (no Content-Length above 0, no Transfer-Encoding) pass straight through.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollout_server.errors import APIError, error_response

_CLOSE = (b"connection", b"close")


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


class BodyDeadline:
    """ASGI: `app`, with each request's body due within `timeout_s` (module docstring)."""

    def __init__(self, app: ASGIApp, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_read = response_started = answered_late = False

        async def receive_in_time() -> Message:
            nonlocal body_read, answered_late
            if body_read:
                return await receive()  # after the body: the client's disconnect, which may come any time
            if answered_late:
                return {"type": "http.disconnect"}
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except TimeoutError:
                if not response_started:
                    answered_late = True
                    await error_response(APIError(
                        408, f"The request body did not arrive within {self.timeout_s:g} s (setting body_timeout_s).",
                        type="invalid_request_error", code="request_timeout", headers={"Connection": "close"},
                    ))(scope, receive, send)
                return {"type": "http.disconnect"}
            body_read = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_unless_answered(message: Message) -> None:
            nonlocal response_started
            if answered_late:
                return
            if message["type"] == "http.response.start" and not response_started:
                response_started = True
                if not body_read:
                    message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        await self.app(scope, receive_in_time, send_unless_answered)
