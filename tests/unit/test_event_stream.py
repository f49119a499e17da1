"""rollout_server/event_stream.py: a streamed response sends every event, and stops (closing its source) when
its client leaves."""

import asyncio

import pytest

from rollout_server.event_stream import EventStreamResponse
from tests.unit.asgi_stubs import ClientStub


async def _events(n: int, closed: list, pause: float = 0.0):
    try:
        for i in range(n):
            await asyncio.sleep(pause)
            yield f"data: {i}\n\n".encode()
    finally:
        closed.append(True)


def test_every_event_is_sent_then_the_response_ends():
    async def run():
        client, closed = ClientStub(), []
        await EventStreamResponse(_events(3, closed), headers={"x-worker-id": "w"})({}, client.receive, client.send)
        return client, closed

    client, closed = asyncio.run(run())
    start = client.sent[0]
    assert start["status"] == 200 and (b"x-worker-id", b"w") in start["headers"]
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert closed == [True]


def test_a_client_that_leaves_stops_the_stream_and_closes_its_source():
    async def run():
        client, closed = ClientStub(), []
        respond = asyncio.ensure_future(
            EventStreamResponse(_events(10_000, closed, pause=0.001))({}, client.receive, client.send))
        while len(client.bodies()) < 3:
            await asyncio.sleep(0.001)
        client.leave()
        await asyncio.wait_for(respond, timeout=5)  # returns normally: the client is gone, not the server
        return client, closed, respond

    client, closed, respond = asyncio.run(run())
    assert closed == [True]
    assert 3 <= len(client.bodies()) < 100 and client.bodies()[-1] != b""
    assert not respond.cancelled()


def test_a_server_shutdown_still_cancels_the_response():
    async def run():
        client, closed = ClientStub(), []
        respond = asyncio.ensure_future(
            EventStreamResponse(_events(10_000, closed, pause=0.001))({}, client.receive, client.send))
        await asyncio.sleep(0.02)
        respond.cancel()
        with pytest.raises(asyncio.CancelledError):
            await respond
        return closed

    assert asyncio.run(run()) == [True]


def test_the_done_event_goes_out_with_the_end_of_the_response_and_the_source_finishes_after_it():
    async def run():
        client, after_done = ClientStub(), []

        async def answer():
            yield b"data: 0\n\n"
            yield b"data: 1\n\ndata: [DONE]\n\n"
            after_done.append(len(client.sent))  # the source's bookkeeping (metrics, traces, usage)

        await EventStreamResponse(answer())({}, client.receive, client.send)
        return client, after_done

    client, after_done = asyncio.run(run())
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\ndata: [DONE]\n\n"]
    assert [m["more_body"] for m in client.sent[1:]] == [True, False]  # no separate empty message to end it
    assert after_done == [3]  # ran once the response's end was sent
