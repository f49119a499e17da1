"""The front door acknowledges Dynamo's response segments at once (engine/client/dynamo_http.py,
`_acknowledge_promptly`): a server that leaves Nagle's algorithm on, as Dynamo's frontend does, would
otherwise hold each streamed request's first token until the client's delayed acknowledgement."""

import asyncio
import socket

import pytest
from aiohttp import web

from engine.client import dynamo_http
from tests.unit.dynamo_doubles import ONE_TOKEN_REQUEST, client_of

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")


class DynamoDouble:
    """A test double of Dynamo's /v1/completions: sends the headers, then (once the client has seen them,
    so the connection is still open when it looks) one token, usage and [DONE]."""

    def __init__(self):
        self.headers_seen = asyncio.Event()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await self.headers_seen.wait()
        self.headers_seen.clear()
        await resp.write(b'data: {"choices":[{"index":0,"text":"a","logprobs":{"tokens":["token_id:7"],'
                         b'"token_logprobs":[-0.5]},"finish_reason":"length"}]}\n\n')
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def two_requests(dynamo: DynamoDouble) -> list[int]:
    """The token ids of two requests, the second on the kept-alive connection of the first."""
    async with client_of(dynamo.completions) as client:
        return [token.token_id for _ in range(2) async for chunk in client.stream_once(ONE_TOKEN_REQUEST)
                for delta in chunk.deltas for token in delta.tokens]


def test_every_response_is_acknowledged_promptly(monkeypatch):
    async def run():
        dynamo = DynamoDouble()
        acknowledge = dynamo_http._acknowledge_promptly

        def acknowledge_from_delayed_mode(resp):
            sock = resp.connection.transport.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # delayed, as on a request/response connection
            acknowledge(resp)
            ack_modes.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK))
            dynamo.headers_seen.set()

        monkeypatch.setattr(dynamo_http, "_acknowledge_promptly", acknowledge_from_delayed_mode)
        return await two_requests(dynamo)

    ack_modes = []
    assert asyncio.run(run()) == [7, 7]
    assert ack_modes == [1, 1]  # both responses acknowledged at once
