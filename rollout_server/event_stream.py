"""A streamed response (server-sent events) that ends when its client leaves.

Starlette's StreamingResponse watches for the client's disconnect with an anyio task group per response
(a task for the body, another for the disconnect, cancel scopes that format a task's repr when they fire),
work paid on every streamed request (docs/benchmarks.md, "Measurements behind design choices"). Here the
body is sent by the request's own task, and one small task waits for the disconnect and cancels it.
Cancelling the body closes the engine stream it reads, which aborts the request on its worker
(rollout_server/disconnect.py does the same for whole responses).

The OpenAI stream's last event, `data: [DONE]`, goes out with the end of the response in one write; the
handlers put the answer's last chunk (and its usage) in front of it, so a stream ends in one write, not
four, each of which woke the client. The source then only finishes: its bookkeeping (metrics, traces,
usage) runs after the client has the whole answer, in the same turn of the event loop.
"""

from __future__ import annotations

from typing import AsyncIterator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from rollout_server.disconnect import ClientWatch

DONE = b"data: [DONE]\n\n"  # an event that ends with it is a stream's last


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], headers: Mapping[str, str] | None = None):
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with ClientWatch(receive):
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            ended = False
            async for event in self.events:
                ended = event.endswith(DONE)
                await send({"type": "http.response.body", "body": event, "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
