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
    with ClientWatch(request.receive):
        return await handler
    log.info("client of %s disconnected before its response: request given up", request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


class ClientWatch:
    """`with ClientWatch(receive):` cancels the block when the client disconnects, and the block ends there;
    any other cancellation (the server shutting down) goes on.

    The task goes on with its work at once; one small task waits for the disconnect. (Running the work in a
    task of its own, raced against the disconnect, delays it by a turn of the event loop, which under load
    is milliseconds on the way of every request.)"""

    def __init__(self, receive: Receive):
        self._task = asyncio.current_task()
        self._closed = False
        self._gone = asyncio.ensure_future(until_client_leaves(receive))
        self._gone.add_done_callback(self._cancel_if_left)

    def __enter__(self) -> "ClientWatch":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        self._closed = True
        self._gone.cancel()
        if kind is asyncio.CancelledError and self._left():
            self._task.uncancel()
            return True  # the client left: nobody is there to answer
        return False

    def _left(self) -> bool:
        return self._gone.done() and not self._gone.cancelled() and self._gone.exception() is None

    def _cancel_if_left(self, _: asyncio.Future) -> None:
        if not self._closed and self._left():
            self._task.cancel()


async def until_client_leaves(receive: Receive) -> None:
    # The body has been read: the next ASGI message can only be the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
