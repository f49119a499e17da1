"""A request whose client has gone is given up, so that its worker stops generating for nobody.

A streamed response notices by itself (rollout_server/event_stream.py ends it on the client's
disconnect, and the engine stream it was reading is closed). A whole response would run to its end: an
RL trainer that timed out, or a killed agent, would leave its requests generating. So the handler races
the client's disconnect, as vLLM's API server does; the loser is cancelled, and cancelling the handler
closes its engine streams, which aborts the request on the worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive

log = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for it; nobody reads it


async def unless_disconnected(request: Request, handler: Awaitable[T]) -> T | Response:
    """`handler`'s response, or an empty 499 when the client disconnects first (the handler is cancelled).
    A streamed response is returned as soon as it starts, so only the work before it is raced."""
    work = asyncio.ensure_future(handler)
    gone = asyncio.ensure_future(until_client_leaves(request.receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    try:
        await work
    except asyncio.CancelledError:
        pass
    log.info("client of %s disconnected before its response: request given up", request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def until_client_leaves(receive: Receive) -> None:
    # The body has been read: the next ASGI message can only be the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
