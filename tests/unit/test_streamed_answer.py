"""`streamed_answer` (rollout_server/serving/generation.py): one piece per engine chunk; the chunk that makes the answer
whole carries the stream's end (usage when asked, [DONE]), so the response ends in one write, and the
generation's bookkeeping runs only after the client has that piece."""

import asyncio
import json

from engine.contract import EngineChunk, SampledToken
from engine.ids import PolicyVersion
from rollout_server.errors import unavailable
from rollout_server.protocol import StreamOptions
from rollout_server.serving.finished import ChoiceResult
from rollout_server.serving.streamed_answer import sse, streamed_answer

DONE = b"data: [DONE]\n\n"
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


class GenerationStub:
    """Test double of a streamed Generation: its chunks, then a log entry where the real one runs its finish
    hooks; a chunk given as an exception is raised instead."""

    def __init__(self, chunks: list, log: list, choices: list[ChoiceResult] | None = None):
        self._chunks = chunks
        self.log = log
        self.choices = choices or []  # what the chunks accumulated

    async def chunks(self):
        for chunk in self._chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk
        self.log.append("bookkeeping")

    def usage_dict(self) -> dict:
        return USAGE

    def sorted_choices(self) -> list[ChoiceResult]:
        return self.choices


def chunk(name: str, final: bool = False) -> EngineChunk:
    return EngineChunk(deltas=[name], final=final)  # events_of below reads a delta as its event's text


def events_of(engine_chunk: EngineChunk) -> list[bytes]:
    return [f"data: {delta}\n\n".encode() for delta in engine_chunk.deltas]


def pieces(chunks: list, options: StreamOptions | None = None, choices: list[ChoiceResult] | None = None) -> list:
    async def run():
        log = []
        stub = GenerationStub(chunks, log, choices)
        async for piece in streamed_answer(stub, {"id": "cmpl-1"}, options, events_of):
            log.append(piece)
        return log

    return asyncio.run(run())


def test_the_last_chunk_carries_the_usage_and_done_and_bookkeeping_comes_after():
    usage_event = sse({"id": "cmpl-1", "choices": [], "usage": USAGE})
    assert pieces([chunk("a"), chunk("b", final=True)], StreamOptions(include_usage=True)) == [
        b"data: a\n\n", b"data: b\n\n" + usage_event + DONE, "bookkeeping"]


def test_without_usage_asked_the_last_chunk_carries_done_alone():
    assert pieces([chunk("a"), chunk("b", final=True)]) == [b"data: a\n\n", b"data: b\n\n" + DONE, "bookkeeping"]


def test_an_engine_stream_that_ends_unflagged_still_ends_the_answer():
    assert pieces([chunk("a"), EngineChunk(deltas=[])]) == [b"data: a\n\n", "bookkeeping", DONE]


def test_an_engine_error_ends_the_answer_with_an_error_event_saying_which_weights_sampled_what_was_sent():
    sent_tokens = [SampledToken(5, -0.1, [], PolicyVersion(3)), SampledToken(6, -0.2, [], PolicyVersion(4))]
    *sent, last = pieces([chunk("a"), unavailable("the engine failed mid-request")],
                         choices=[ChoiceResult(0, "a", sent_tokens), ChoiceResult(1)])
    assert sent == [b"data: a\n\n"]
    error, done = last.split(b"\n\n", 1)
    event = json.loads(error.removeprefix(b"data: "))
    assert event["error"]["message"] == "the engine failed mid-request"
    assert event["choices"] == [{"index": 0, "policy_versions": [{"version": 3, "first_token_index": 0},
                                                                 {"version": 4, "first_token_index": 1}]}]
    assert done == DONE
