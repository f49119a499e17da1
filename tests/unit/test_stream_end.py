"""A request's answer is whole at the chunk that ends its last choice with the usage (engine/client/dynamo_http.py,
`EngineChunk.final`): what Dynamo's frontend sends after it (a usage-only chunk and `[DONE]`, once its worker
has closed the request's stream) is read off the request's way, and the connection is kept for the next."""

import asyncio
import json

from aiohttp import web

from engine.client.dynamo_http import DynamoFrontendClient, _sse_chunks
from tests.unit.dynamo_doubles import ONE_TOKEN_REQUEST, PiecesStubReader, client_of

USAGE = b'"usage":{"prompt_tokens":2,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}'


def _event(index: int, token: int, finish: str | None, completion_tokens: int | None) -> bytes:
    choice = {"index": index, "text": "a", "finish_reason": finish,
              "logprobs": {"tokens": [f"token_id:{token}"], "token_logprobs": [-0.5]}}
    usage = b"," + USAGE % completion_tokens if completion_tokens is not None else b""
    return b'data: {"choices":[' + json.dumps(choice).encode() + b"]" + usage + b"}\n\n"


CLOSING = b'data: {"choices":[],' + USAGE % 2 + b"}\n\ndata: [DONE]\n\n"


def _finals(pieces: list[bytes], choices: int) -> list[bool]:
    async def read():
        return [chunk.final async for chunk in _sse_chunks(PiecesStubReader(pieces), 0, choices)]
    return asyncio.run(read())


def test_the_chunk_that_ends_the_last_choice_with_the_usage_is_final():
    stream = [_event(0, 7, None, 1), _event(1, 8, "length", 2), _event(0, 9, "stop", 3), CLOSING]
    assert _finals(stream, choices=2) == [False, False, True, True]


def test_without_the_usage_in_the_finishing_chunk_the_stream_is_read_to_its_end():
    stream = [_event(0, 7, None, None), _event(0, 9, "stop", None), CLOSING]
    assert _finals(stream, choices=1) == [False, False, True]


class DynamoDouble:
    """A test double of Dynamo's /v1/completions: one token that ends the choice, with the usage; then it holds
    the stream's closing until `closing_allowed` is set, and sends it (or, `cut`, drops the connection)."""

    def __init__(self, cut: bool = False):
        self.cut = cut
        self.closing_allowed = asyncio.Event()
        self.bodies: list[dict] = []
        self.peers: list[tuple] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.peers.append(request.transport.get_extra_info("peername"))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event(0, 7, "length", 1))
        await self.closing_allowed.wait()
        if self.cut:
            request.transport.close()
        else:
            await resp.write(CLOSING)
        return resp


def test_the_answer_ends_before_dynamo_closes_the_stream_and_the_connection_is_kept():
    answers, dynamo = asyncio.run(_two_answers(DynamoDouble()))
    assert answers == [[(7, 1)], [(7, 1)]]
    assert all(body["stream_options"]["continuous_usage_stats"] for body in dynamo.bodies)
    assert dynamo.peers[0] == dynamo.peers[1]  # the second request went on the first one's connection


def test_a_stream_cut_after_its_answer_leaves_the_answers_whole(caplog):
    answers, dynamo = asyncio.run(_two_answers(DynamoDouble(cut=True)))
    assert answers == [[(7, 1)], [(7, 1)]]
    assert dynamo.peers[0] != dynamo.peers[1]  # the cut connection was not reused
    assert "failed after its last token" in caplog.text


async def _two_answers(dynamo: DynamoDouble) -> tuple[list, DynamoDouble]:
    """Two requests in turn; each answer is read while the double holds its stream's closing."""
    answers = []
    async with client_of(dynamo.completions) as client:
        for _ in range(2):
            chunks = await asyncio.wait_for(_collect(client.stream_once(ONE_TOKEN_REQUEST)), timeout=5)
            assert not dynamo.closing_allowed.is_set()  # answered while Dynamo still held its closing
            answers.append([(t.token_id, c.usage.completion_tokens) for c in chunks for d in c.deltas
                            for t in d.tokens])
            dynamo.closing_allowed.set()
            await asyncio.wait_for(_until_read_to_the_end(client), timeout=5)
            dynamo.closing_allowed.clear()
    return answers, dynamo


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


async def _until_read_to_the_end(client: DynamoFrontendClient) -> None:
    while client._closing:
        await asyncio.sleep(0.01)
