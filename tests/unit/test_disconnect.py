"""rollout_server/disconnect.py: a request's handler runs at once in the request's task, is cancelled (a 499)
when its client leaves first, and is left alone by a client that stays."""

import asyncio

import pytest

from rollout_server.disconnect import CLIENT_CLOSED_REQUEST, unless_disconnected
from tests.unit.asgi_stubs import ClientStub


class RequestStub:
    """Test double of the handler's `Request`: what unless_disconnected reads of it."""

    def __init__(self, client: ClientStub):
        self.receive = client.receive
        self.url = type("URL", (), {"path": "/v1/completions"})()


async def _handler(steps: list, pause: float):
    steps.append(("started", asyncio.current_task()))
    try:
        await asyncio.sleep(pause)
        return "response"
    except asyncio.CancelledError:
        steps.append(("cancelled", None))
        raise


def test_the_handler_runs_in_the_request_task_and_its_response_is_returned():
    async def run():
        client, steps = ClientStub(), []
        response = await unless_disconnected(RequestStub(client), _handler(steps, 0.01))
        await asyncio.sleep(0.01)
        return response, steps, asyncio.current_task(), len(asyncio.all_tasks())

    response, steps, task, tasks = asyncio.run(run())
    assert response == "response"
    assert steps == [("started", task)]  # no task of its own: no turn of the event loop before it starts
    assert tasks == 1                    # the disconnect watch is gone with the request


def test_a_client_that_leaves_first_cancels_the_handler_and_gets_a_499():
    async def run():
        client, steps = ClientStub(), []
        asyncio.get_running_loop().call_later(0.02, client.leave)
        response = await unless_disconnected(RequestStub(client), _handler(steps, 5))
        return response, steps, asyncio.current_task().cancelling()

    response, steps, cancelling = asyncio.run(run())
    assert response.status_code == CLIENT_CLOSED_REQUEST
    assert [step for step, _ in steps] == ["started", "cancelled"]
    assert cancelling == 0  # the request's task goes on to send the 499


def test_a_server_shutdown_still_cancels_the_request():
    async def run():
        client, steps = ClientStub(), []
        request = asyncio.ensure_future(unless_disconnected(RequestStub(client), _handler(steps, 60)))
        await asyncio.sleep(0.02)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        return steps

    assert [step for step, _ in asyncio.run(run())] == ["started", "cancelled"]
