"""A front door's serving path with a test double in place of the engine, shared by the team-isolation and quota
tests: the real ServingContext, handlers, Generation, TeamScope and RateLimiter; only the engine is a double."""

from __future__ import annotations

import asyncio
import time

from engine.client.dispatch import Dispatcher
from engine.contract import ChoiceDelta, EngineChunk, EngineRequest, EngineUsage, SampledToken
from engine.ids import WorkerId
from engine.supervisor.pool_config import PoolConfig
from engine.supervisor.pools import Deployment, Pool, PoolSet
from finetune_deploy.served_models import ModelTable
from rollout_server.metrics import Metrics
from rollout_server.quotas import KeyLimits, RateLimiter
from rollout_server.serving.context import ServingContext
from rollout_server.settings import Settings
from rollout_server.tokenizer import ModelTokenizer

MODEL = "tiny-qwen2"
WORKER = WorkerId(7)


class RecordingEngineDouble:
    """Test double of an engine client: records every engine request and answers it with two tokens, the second
    in the final chunk; with `hold`, the final chunk waits until the test opens that request's gate."""

    via = "a test double"

    def __init__(self, hold: bool = False):
        self.hold = hold
        self.requests: list[EngineRequest] = []
        self.gates: list[asyncio.Event] = []

    async def stream_once(self, req: EngineRequest):
        gate = asyncio.Event()
        if not self.hold:
            gate.set()
        self.requests.append(req)
        self.gates.append(gate)
        yield EngineChunk([ChoiceDelta(0, "a", [SampledToken(11, -0.5, [])], None)], worker_id=WORKER)
        await gate.wait()
        usage = EngineUsage(prompt_tokens=len(req.prompt_token_ids), completion_tokens=2, cached_tokens=0)
        yield EngineChunk([ChoiceDelta(0, "b", [SampledToken(12, -0.25, [])], "length")], usage, WORKER, final=True)


def serving_context(model_dir, tmp_path, engine: RecordingEngineDouble, limiter: RateLimiter | None = None,
                    **settings) -> ServingContext:
    """The front door's serving state over `engine` (one deployment of the default pool), with `limiter` admitting
    and settling every request as the server wires it (rollout_server/server.py)."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'keys.db'}", **settings)
    deployment = Deployment("default/0", None, engine, ready_workers=1)
    ctx = ServingContext(settings=settings, tokenizer=ModelTokenizer(model_dir),
                         client=Dispatcher(PoolSet(settings, [Pool(PoolConfig(name="default", kind="shared"),
                                                                   [deployment])])),
                         metrics=Metrics(), models=ModelTable(MODEL, 0, str(model_dir)), max_model_len=32768)
    if limiter is not None:
        ctx.limiter = limiter
        ctx.on_finish.append(limiter.on_finish)
    return ctx


def limiter_for(limits: KeyLimits, clock=time.monotonic) -> RateLimiter:
    """A RateLimiter giving every key `limits`."""
    async def limits_for(_key_prefix: str) -> KeyLimits:
        return limits

    return RateLimiter(limits_for, clock)


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)
