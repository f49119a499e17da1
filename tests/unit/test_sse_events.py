"""engine/client/dynamo_http.py reads Dynamo's server-sent events in whatever pieces the network delivers."""

import asyncio
import random

from engine.client.dynamo_http import _sse_events
from tests.unit.dynamo_doubles import PiecesStubReader

STREAM = (b'data: {"a": 1}\n\n'
          b': a comment line\n\n'
          b'event: error\r\ndata: {"error": "boom"}\r\n\r\n'
          b'data: {"b": 2}\n\n'
          b'data: [DONE]\n\n')
EVENTS = [(None, b'{"a": 1}'), ("error", b'{"error": "boom"}'), (None, b'{"b": 2}'), (None, b"[DONE]")]


def _read(pieces: list[bytes]) -> list:
    async def collect():
        return [event async for event in _sse_events(PiecesStubReader(pieces))]
    return asyncio.run(collect())


def test_events_read_whole():
    assert _read([STREAM]) == EVENTS


def test_events_split_anywhere_read_the_same():
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 12)))
        pieces = [STREAM[a:b] for a, b in zip([0] + cuts, cuts + [len(STREAM)])]
        assert _read(pieces) == EVENTS, pieces


def test_every_byte_alone_reads_the_same():  # "\r" and "\n" of one line ending in different pieces
    assert _read([STREAM[i:i + 1] for i in range(len(STREAM))]) == EVENTS


def test_an_event_cut_off_by_the_end_of_the_stream_is_not_read():
    assert _read([b'data: {"a": 1}\n\ndata: {"b"']) == [(None, b'{"a": 1}')]
