"""A streamed answer's server-sent events.

Each engine chunk's events go out in one write. The chunk that makes the answer whole carries the stream's end
too (the usage, when the client asked for it, and `[DONE]`), so the response ends in that same write
(rollout_server/event_stream.py); an error ends the stream with an OpenAI error event, which also says which
policy versions sampled the tokens already sent (`choices[i].policy_versions`: a client that keeps them, such as an
RL trainer, knows what it holds).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

import msgspec

from engine.contract import EngineChunk
from rollout_server.errors import APIError
from rollout_server.event_stream import DONE
from rollout_server.protocol import StreamOptions
from rollout_server.serving.finished import policy_versions
from rollout_server.serving.generation import Generation


def running_usage_of(generation: Generation, wanted: bool) -> dict:
    """The usage so far, as a streamed chunk's `usage` field, when the client asked for it in every chunk."""
    return {"usage": generation.usage_dict()} if wanted else {}


def sse(payload: dict) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def streamed_answer(generation: Generation, base: dict, options: StreamOptions | None,
                          events_of: Callable[[EngineChunk], list[bytes]]) -> AsyncIterator[bytes]:
    """A streamed answer's body: each engine chunk's events (`events_of`) in one piece. The chunk that makes the
    answer whole carries the stream's end (the usage, when the client asked for it, and [DONE]), so the
    response ends in the same write (rollout_server/event_stream.py); an error ends it with an error event."""
    ended = False
    try:
        async for chunk in generation.chunks():
            events = events_of(chunk)
            if chunk.final:
                events.append(stream_end(base, options, generation.usage_dict()))
                ended = True
            if events:
                yield b"".join(events)
        if not ended:
            yield stream_end(base, options, generation.usage_dict())
    except APIError as err:
        sent = [{"index": c.index, "policy_versions": policy_versions(c.tokens)}
                for c in generation.sorted_choices() if c.tokens]
        yield sse({**err.body(), **({"choices": sent} if sent else {})}) + DONE


def stream_end(base: dict, options: StreamOptions | None, usage: dict) -> bytes:
    """A stream's last events: its usage, when the client asked for it, and [DONE]."""
    return (sse({**base, "choices": [], "usage": usage}) if options and options.include_usage else b"") + DONE
