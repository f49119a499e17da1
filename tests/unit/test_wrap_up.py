"""A generation's wrap-up (rollout_server/serving/generation.py): a whole response goes out at the engine's final chunk;
the rest of the engine stream is read and the finish hooks (usage, quotas, traces) run after it, in a task the
server waits for at shutdown. A stream that fails before its final chunk is still an error, with no hooks."""

import asyncio
import json

import pytest

from engine.client.dispatch import Dispatcher
from engine.contract import ChoiceDelta, EngineChunk, EngineUsage, SampledToken
from engine.supervisor.pool_config import PoolConfig
from engine.supervisor.pools import Deployment, Pool, PoolSet
from finetune_deploy.served_models import ModelTable
from rollout_server.app import AppState, create_app
from rollout_server.auth import Authenticator, KeyStore, open_database
from rollout_server.errors import unavailable
from rollout_server.metrics import Metrics
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings
from rollout_server.tokenizer import ModelTokenizer
from tests.tiny_models import untrained_tiny_model

BODY = {"model": "tiny-qwen2", "prompt": [5, 6, 7], "max_tokens": 2}


class EngineClientDouble:
    """Test double of an engine client: two tokens, the second final; then, if asked, a failure instead of the
    stream's end. Writes to `log` when its stream has been read to the end."""

    route = "a test double"

    def __init__(self, log: list, fail_before_final: bool = False):
        self.log = log
        self.fail_before_final = fail_before_final

    async def stream_once(self, req):
        yield EngineChunk([ChoiceDelta(0, "a", [SampledToken(11, -0.5, [])], None)], worker_id="7")
        if self.fail_before_final:
            raise unavailable("the worker died")
        usage = EngineUsage(prompt_tokens=3, completion_tokens=2, cached_tokens=0)
        yield EngineChunk([ChoiceDelta(0, "b", [SampledToken(12, -0.25, [])], "length")], usage, "7", final=True)
        self.log.append("engine stream read to its end")


@pytest.fixture(scope="module")
def model_dir():
    return untrained_tiny_model()


def serve(model_dir, tmp_path, log: list, **double) -> tuple:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'keys.db'}")
    deployment = Deployment("default/0", None, EngineClientDouble(log, **double), ready_workers=1)
    client = Dispatcher(PoolSet(settings, [Pool(PoolConfig(name="default", kind="shared"), [deployment])]))
    ctx = ServingContext(settings=settings, tokenizer=ModelTokenizer(model_dir), client=client, metrics=Metrics(),
                         models=ModelTable("tiny-qwen2", 0, str(model_dir)), max_model_len=32768)

    async def hook(finished):
        log.append(f"hook: {finished.completion_tokens} tokens")

    ctx.on_finish.append(hook)
    auth = Authenticator(KeyStore(open_database(settings.state.database_url)), open_mode=True)
    app = create_app(AppState(ctx=ctx, auth=auth))
    return app, ctx


def run(app, ctx, log: list, body: dict) -> tuple[int, bytes]:
    """POSTs `body` to /v1/completions through the ASGI app, then waits for the wrap-ups; the log gets "answered"
    when the response's last piece is sent and "handler returned" when the app's call ends."""
    status, pieces = [], []

    async def receive():
        return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            pieces.append(message.get("body", b""))
            if not message.get("more_body"):
                log.append("answered")

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"content-type", b"application/json")],
             "query_string": b"", "scheme": "http", "server": ("test", 80), "client": ("127.0.0.1", 1), "root_path": "",
             "http_version": "1.1", "asgi": {"version": "3.0"}}

    async def go():
        await app(scope, receive, send)
        log.append("handler returned")
        await ctx.wrapped_up()

    asyncio.run(go())
    return status[0], b"".join(pieces)


def test_a_whole_response_goes_out_before_the_stream_end_and_the_hooks(model_dir, tmp_path):
    log = []
    app, ctx = serve(model_dir, tmp_path, log)
    status, body = run(app, ctx, log, BODY)
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "ab"
    assert log == ["answered", "handler returned", "engine stream read to its end", "hook: 2 tokens"]
    assert ctx.metrics.registry.get_sample_value("rollout_requests_total", {"endpoint": "completions", "outcome": "ok"}) == 1


def test_a_streamed_response_ends_with_done_before_the_stream_end_and_the_hooks(model_dir, tmp_path):
    log = []
    app, ctx = serve(model_dir, tmp_path, log)
    status, body = run(app, ctx, log, {**BODY, "stream": True})
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    assert log == ["answered", "handler returned", "engine stream read to its end", "hook: 2 tokens"]


def test_a_stream_that_fails_before_its_final_chunk_is_an_error_without_hooks(model_dir, tmp_path):
    log = []
    app, ctx = serve(model_dir, tmp_path, log, fail_before_final=True)
    status, body = run(app, ctx, log, BODY)
    assert status == 503 and "the worker died" in json.loads(body)["error"]["message"]
    assert log == ["answered", "handler returned"]
