"""The front door re-sends a request Dynamo refused with a 503 before any output, and never one that
already streamed. Dynamo's frontend is replaced by an httpx MockTransport test double here; the real
case (a decode worker killed, the next request served by the other one) is in tests/disagg."""

import asyncio
import json

import httpx
import pytest

from engine.frontend_client import DynamoFrontendClient, EngineRequest
from rollout_server.errors import APIError

REQUEST = EngineRequest(model="tiny", request_id="r1", prompt_token_ids=[1, 2, 3], max_tokens=1, sampling={})
TOKEN = {"choices": [{"index": 0, "text": "a", "finish_reason": "length",
                      "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{}]}}]}
REFUSED = (503, {"message": "Service temporarily unavailable"})


def sse(*payloads: dict) -> bytes:
    return b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in payloads) + b"data: [DONE]\n\n"


class FakeDynamoFrontend:
    """Test double: answers each POST with the next scripted (status, body) and counts the calls."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        status, body = self.answers.pop(0)
        if isinstance(body, Exception):
            raise body
        if status == 200:
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(status, json=body)


def collect(fake: FakeDynamoFrontend, retries: int = 3) -> list:
    async def run():
        client = DynamoFrontendClient("http://dynamo", unavailable_retries=retries, retry_delay_s=0.01)
        client.http = httpx.AsyncClient(base_url="http://dynamo", transport=httpx.MockTransport(fake))
        try:
            return [chunk async for chunk in client.stream(REQUEST)]
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_refusal_before_output_is_sent_again():
    fake = FakeDynamoFrontend(REFUSED, REFUSED, (200, sse(TOKEN)))
    chunks = collect(fake)
    assert fake.calls == 3
    assert [t.token_id for c in chunks for d in c.deltas for t in d.tokens] == [7]


def test_refusals_past_the_retry_budget_reach_the_client_as_503():
    fake = FakeDynamoFrontend(REFUSED, REFUSED, REFUSED)
    with pytest.raises(APIError) as refused:
        collect(fake, retries=2)
    assert fake.calls == 3 and refused.value.status == 503 and refused.value.code == "service_unavailable"


def test_a_connection_that_was_never_made_is_tried_again():
    fake = FakeDynamoFrontend((0, httpx.ConnectTimeout("busy")), (0, httpx.ConnectError("refused")), (200, sse(TOKEN)))
    assert len(collect(fake)) == 1 and fake.calls == 3


@pytest.mark.parametrize("status", [400, 404, 500])
def test_other_errors_are_not_retried(status):
    fake = FakeDynamoFrontend((status, {"message": "no"}), (200, sse(TOKEN)))
    with pytest.raises(APIError):
        collect(fake)
    assert fake.calls == 1


def test_a_stream_that_fails_after_output_is_not_sent_again():
    fake = FakeDynamoFrontend((200, sse(TOKEN, {"error": "worker died"})), (200, sse(TOKEN)))
    with pytest.raises(APIError) as failed:
        collect(fake)
    assert fake.calls == 1 and failed.value.status == 503
