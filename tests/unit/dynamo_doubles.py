"""Test doubles of Dynamo's frontend: a local server for a /v1/completions handler, and the front door's client
of it (engine/client/dynamo_http.py); a response body handed over in given pieces."""

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from engine.client.dynamo_http import DynamoFrontendClient
from engine.contract import EngineRequest

ONE_TOKEN_REQUEST = EngineRequest(model="m", request_id="r", prompt_token_ids=[1, 2], max_tokens=1)


@asynccontextmanager
async def client_of(completions: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> AsyncIterator[DynamoFrontendClient]:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    client = DynamoFrontendClient(f"http://127.0.0.1:{port}")
    try:
        yield client
    finally:
        await client.close()
        await runner.cleanup()


class PiecesStubReader:
    """Test double of aiohttp's StreamReader: hands the body over in the given pieces."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    async def iter_any(self):
        for piece in self.pieces:
            yield piece
