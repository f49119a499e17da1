"""Failover in the front door (engine/client/dispatch.py): a request refused before any output is sent again,
to another deployment of its pool when there is one; a stream that already produced tokens never is.
Dynamo's frontends are scripted local HTTP servers here (test doubles; the deployments' stacks are test
doubles too, and no supervisor runs); the real cases (a worker or a whole
deployment killed under load) are in tests/pools and tests/disagg."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from engine.client.dispatch import Dispatcher
from engine.client.dynamo_http import DynamoFrontendClient
from engine.contract import EngineRequest
from engine.errors import EngineUnavailable, RequestRejected
from engine.sessions import deployment_slot
from engine.settings import EngineSettings
from engine.supervisor.pool_config import PoolConfig
from engine.supervisor.pools import Deployment, Pool, PoolSet
from engine.supervisor.worker_control import WorkerControlError, WorkerHandle
from rollout_server.harness.stack import REPO

TOKEN = {"choices": [{"index": 0, "text": "a", "finish_reason": "length",
                      "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{}]}}]}
REFUSED = (503, {"message": "Service temporarily unavailable"})


def sse(*payloads: dict, done: bool = True) -> bytes:
    return b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in payloads) + (b"data: [DONE]\n\n" if done else b"")


def request(session: str = "s1") -> EngineRequest:
    return EngineRequest(model="tiny", request_id="r1", prompt_token_ids=[1, 2, 3], max_tokens=1,
                         session_id=session, pool="p")


class FakeDynamoFrontend:
    """Test double: a local HTTP server (its own thread and event loop) that answers each POST with the
    next scripted (status, body) and counts the calls."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listening.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/completions", self._answer)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, self.listening).start())
        loop.run_forever()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.calls += 1
        status, body = self.answers.pop(0)
        if status != 200:
            return web.json_response(body, status=status)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(body)
        return response


class UnreachableFirst(aiohttp.TCPConnector):
    """Test double: the first `failures` connection attempts fail as an unreachable frontend's do."""

    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures
        self.attempts = 0

    async def connect(self, req, traces, timeout):
        self.attempts += 1
        if self.attempts == 1 and self.failures:
            raise aiohttp.ConnectionTimeoutError("busy")
        if self.attempts <= self.failures:
            raise aiohttp.ClientConnectorError(req.connection_key, ConnectionRefusedError(111, "refused"))
        return await super().connect(req, traces, timeout)


class StackDouble:
    """Test double for a deployment's Stack and its StackHealth: no process of it has crashed, unless `dead`; a restart takes
    `restart_s` (a loaded machine)."""

    def __init__(self, dead: bool = False, restart_s: float = 0.0):
        self.dead = dead
        self.restart_s = restart_s
        self.restarts = 0

    def crashed_worker(self) -> str | None:
        return "worker-0 exit code -9" if self.dead else None

    def all_alive(self) -> bool:
        return not self.dead

    def restart_dead(self) -> list[int]:
        time.sleep(self.restart_s)
        self.restarts += 1
        self.dead = False
        return [0]

    def ready_worker_indices(self) -> list[int]:
        return [] if self.dead else [0]

    def joined_workers(self) -> list[dict]:
        return []  # one host: no worker joined from another

    def unlisted_workers(self) -> list[int]:
        return []  # every running worker is in discovery

    def serves_a_request(self) -> bool:
        return True

    def worker_handles(self) -> list[WorkerHandle]:
        return [WorkerHandle(0, 18080)]


class StackLosingASecondWorkerDuringTheRestart(StackDouble):
    """Worker 0 is found dead; worker 1 dies while the supervisor restarts worker 0, so it is restarted too."""

    def restart_dead(self) -> list[int]:
        super().restart_dead()
        return [0, 1]

    def ready_worker_indices(self) -> list[int]:
        return [] if self.dead else [0, 1]

    def worker_handles(self) -> list[WorkerHandle]:
        return [WorkerHandle(0, 18080), WorkerHandle(1, 18081)]


def deployment(name: str, fake: FakeDynamoFrontend, ready: int = 1, connector=None, stack=None) -> Deployment:
    stack = stack or StackDouble()
    return Deployment(name, stack=stack, client=DynamoFrontendClient(fake.url, connector=connector),
                      ready_workers=ready, health=stack)


def run(pool: Pool, req: EngineRequest | None = None, retries: int = 3, during=None, between=None,
        retry_delay_s: float = 0.01) -> list:
    """Sends `req` (a list: one after the other, `between(i)` before the i-th) through a Dispatcher."""
    requests = req if isinstance(req, list) else [req or request()]

    async def go():
        router = Dispatcher(PoolSet(EngineSettings(), [pool]), retries=retries, retry_delay_s=retry_delay_s)
        side = asyncio.create_task(during()) if during else None
        try:
            chunks = []
            for i, one in enumerate(requests):
                if between:
                    between(i)
                chunks += [chunk async for chunk in router.stream(one)]
            return chunks
        finally:
            if side:
                side.cancel()
            await router.close()

    return asyncio.run(go())


def one_deployment_pool(fake: FakeDynamoFrontend, kind: str = "shared", **config) -> Pool:
    return Pool(PoolConfig(name="p", kind=kind, **config), [deployment("p/0", fake)])


def token_ids(chunks) -> list[int]:
    return [t.token_id for c in chunks for d in c.deltas for t in d.tokens]


def test_a_refusal_before_output_is_sent_again():
    fake = FakeDynamoFrontend(REFUSED, REFUSED, (200, sse(TOKEN)))
    assert token_ids(run(one_deployment_pool(fake))) == [7]
    assert fake.calls == 3


def test_refusals_past_the_retry_budget_reach_the_caller_as_unavailable():
    fake = FakeDynamoFrontend(REFUSED, REFUSED, REFUSED)
    with pytest.raises(EngineUnavailable):
        run(one_deployment_pool(fake), retries=2)
    assert fake.calls == 3


def test_a_connection_that_was_never_made_is_tried_again():
    fake = FakeDynamoFrontend((200, sse(TOKEN)))
    made = []

    def connector():  # a connect timeout, then a refused connection, then the frontend answers
        made.append(UnreachableFirst(failures=2))
        return made[-1]

    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", fake, connector=connector)])
    assert len(run(pool)) == 1
    assert [c.attempts for c in made] == [3] and fake.calls == 1


def test_a_worker_that_dies_before_its_first_token_is_retried():
    fake = FakeDynamoFrontend((200, sse({"error": "worker died"})), (200, b""), (200, sse(TOKEN)))
    assert token_ids(run(one_deployment_pool(fake))) == [7]
    assert fake.calls == 3


def test_a_bad_request_is_not_retried():
    fake = FakeDynamoFrontend((400, {"message": "no"}), (200, sse(TOKEN)))
    with pytest.raises(RequestRejected) as refused:
        run(one_deployment_pool(fake))
    assert fake.calls == 1 and refused.value.status == 400


def test_a_request_the_engine_refuses_in_its_stream_is_a_client_error_not_retried():
    # What Dynamo streams when vLLM refuses a request it had accepted (e.g. its sampling parameters).
    refused_in_stream = {"message": "Invalid request", "type": "invalid_request_error", "code": 400}
    fake = FakeDynamoFrontend((200, sse(refused_in_stream)), (200, sse(TOKEN)))
    with pytest.raises(RequestRejected) as refused:
        run(one_deployment_pool(fake))
    assert fake.calls == 1 and refused.value.status == 400 and "Invalid request" in refused.value.message


@pytest.mark.parametrize("status", [404, 500])
def test_a_deployment_that_lost_its_workers_or_failed_before_output_is_retried(status):
    # Dynamo answers 404 for a model whose last worker went away: another deployment may still serve it.
    fake = FakeDynamoFrontend((status, {"message": "model not found"}), (200, sse(TOKEN)))
    assert token_ids(run(one_deployment_pool(fake))) == [7] and fake.calls == 2


@pytest.mark.parametrize("broken", [sse(TOKEN, {"error": "worker died"}), sse(TOKEN, done=False)])
def test_a_stream_that_fails_after_output_is_not_sent_again(broken):
    fake = FakeDynamoFrontend((200, broken), (200, sse(TOKEN)))
    with pytest.raises(EngineUnavailable):
        run(one_deployment_pool(fake))
    assert fake.calls == 1


def test_a_refused_request_fails_over_to_the_other_deployment_at_once():
    down, up = FakeDynamoFrontend(REFUSED), FakeDynamoFrontend((200, sse(TOKEN)))
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", down), deployment("p/1", up)])
    # Both look healthy; whichever the session hashes to first, the request ends on p/1.
    sessions = [s for s in (f"s{i}" for i in range(50)) if deployment_slot(s, 2) == 0]
    started = time.monotonic()
    assert token_ids(run(pool, request(sessions[0]), retry_delay_s=30)) == [7]
    assert time.monotonic() - started < 10, "failover waited for the pause between rounds of retries"
    assert (down.calls, up.calls, pool.failovers) == (1, 1, 1)
    assert pool.in_flight == 0 and [d.in_flight for d in pool.deployments] == [0, 0]


def test_a_deployment_counts_the_requests_streaming_from_it():
    fake = FakeDynamoFrontend((200, sse(TOKEN)))
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", fake)])
    seen = []

    async def go():
        router = Dispatcher(PoolSet(EngineSettings(), [pool]))
        try:
            async for _ in router.stream(request()):
                seen.append(pool.deployments[0].in_flight)
        finally:
            await router.close()

    asyncio.run(go())
    assert seen and set(seen) == {1} and pool.deployments[0].in_flight == 0


def test_a_request_every_healthy_deployment_refused_tries_one_out_of_rotation():
    # p/1 missed its health checks (a loaded machine) but serves; losing the request is the alternative.
    down, missed_checks = FakeDynamoFrontend(REFUSED), FakeDynamoFrontend((200, sse(TOKEN)))
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", down), deployment("p/1", missed_checks, ready=0)])
    started = time.monotonic()
    assert token_ids(run(pool, retry_delay_s=30)) == [7]
    assert time.monotonic() - started < 10, "failover waited for the pause between rounds of retries"
    assert (down.calls, missed_checks.calls, pool.failovers) == (1, 1, 1)


def test_refusals_from_every_deployment_are_retried_after_pauses_that_double():
    fakes = [FakeDynamoFrontend(REFUSED, REFUSED, (200, sse(TOKEN))) for _ in range(2)]
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", fakes[0]), deployment("p/1", fakes[1])])
    started = time.monotonic()
    assert token_ids(run(pool, retry_delay_s=0.2)) == [7]
    # Rounds of one try per deployment, each after the other: p/0 and p/1, a 0.2 s pause, both again,
    # a 0.4 s pause, then the one that answers.
    assert sorted(f.calls for f in fakes) == [2, 3] and pool.failovers == 2
    # 0.2 + 0.4 s of pauses; the upper bound only catches pauses far too long (a stalled VM can add seconds).
    assert 0.6 <= time.monotonic() - started < 5.0


def test_a_deployment_with_a_dead_process_leaves_rotation_before_its_slow_restart():
    fake = FakeDynamoFrontend()
    crashed = StackDouble(dead=True, restart_s=1.0)
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", fake, stack=crashed)])

    async def check():
        pools = PoolSet(EngineSettings(), [pool])
        checking = asyncio.create_task(pools.check_once())
        await asyncio.sleep(0.2)
        in_rotation_during_restart = pool.deployments[0].healthy
        await checking
        return in_rotation_during_restart

    assert asyncio.run(check()) is False
    assert crashed.restarts == 1 and not pool.deployments[0].healthy


@pytest.mark.parametrize("first_load_fails", [False, True])
def test_a_restarted_worker_loads_the_served_adapters_and_a_failed_load_does_not_keep_it_out(first_load_fails):
    crashed = StackDouble(dead=True)
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", FakeDynamoFrontend(), stack=crashed)])
    loads: list[list[int]] = []

    async def load_adapters(workers: list[WorkerHandle]) -> None:
        loads.append([w.index for w in workers])
        if first_load_fails and len(loads) == 1:
            raise WorkerControlError("worker-0: adapter file missing")

    async def checks() -> list[tuple[bool, int]]:
        pools = PoolSet(EngineSettings(), [pool])
        pools.prepare_workers = load_adapters
        seen = []
        for _ in range(3):  # the restart; the check that finds the worker ready; one more
            await pools.check_once()
            seen.append((pool.deployments[0].healthy, len(loads)))
        return seen

    # Loaded before it rejoins rotation; a failed load leaves it serving the base model, tried again next check.
    assert asyncio.run(checks()) == [(False, 0), (True, 1), (True, 2 if first_load_fails else 1)]
    assert crashed.restarts == 1 and pool.deployments[0].fresh_workers == set()


def test_a_session_stays_on_one_deployment_and_unhealthy_ones_get_nothing():
    fakes = [FakeDynamoFrontend(*[(200, sse(TOKEN))] * 4) for _ in range(2)]
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", fakes[0]), deployment("p/1", fakes[1])])
    calls_after_two = []

    def between(i):
        if i == 2:
            calls_after_two.extend(f.calls for f in fakes)
            pool.deployments[0].ready_workers = 0   # p/0 fails its health check

    run(pool, [request("one-session"), request("one-session"), request("one-session"), request("another-session")],
        between=between)
    assert sorted(calls_after_two) == [0, 2]
    assert fakes[1].calls == 4 - calls_after_two[0] and fakes[0].calls == calls_after_two[0]


def test_a_session_maps_to_the_same_deployment_in_every_front_door_process():
    """Python's hash() of a string changes with each process (PYTHONHASHSEED): a front door restart must
    not move sessions away from their KV."""
    script = "from engine.sessions import deployment_slot; print([deployment_slot(f's{i}', 2) for i in range(32)])"
    slots = {subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": seed}, cwd=REPO,
                            capture_output=True, text=True, check=True).stdout for seed in ("1", "2", "3")}
    assert len(slots) == 1
    assert set(json.loads(slots.pop())) == {0, 1}     # and sessions do spread over both


def test_a_serverless_pool_at_zero_holds_the_request_until_its_worker_is_ready():
    fake = FakeDynamoFrontend((200, sse(TOKEN)))
    pool = Pool(PoolConfig(name="p", kind="serverless", min_workers=0, max_workers=1),
                [deployment("p/0", fake, ready=0)])

    async def worker_becomes_ready():
        while not pool.waiting:      # the supervisor sees a waiting request and starts a worker
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        pool.deployments[0].ready_workers = 1

    assert token_ids(run(pool, during=worker_becomes_ready)) == [7]
    assert pool.waiting == 0 and fake.calls == 1


def test_a_cold_start_that_takes_too_long_is_unavailable_naming_the_pool():
    pool = Pool(PoolConfig(name="p", kind="serverless", cold_start_timeout_s=0.3),
                [deployment("p/0", FakeDynamoFrontend(), ready=0)])
    with pytest.raises(EngineUnavailable) as late:
        run(pool)
    assert "pool p" in late.value.message and pool.waiting == 0


class CrashingStackDouble:
    """Test double for a deployment's Stack whose starting worker has exited."""

    def crashed_worker(self) -> str:
        return "vllm-aggregated-worker-0 exit code 1"


def test_a_cold_start_whose_worker_crashes_fails_at_once_naming_it():
    pool = Pool(PoolConfig(name="p", kind="serverless", cold_start_timeout_s=60),
                [Deployment("p/0", CrashingStackDouble(), DynamoFrontendClient("http://p0"), ready_workers=0)])
    started = time.monotonic()
    with pytest.raises(EngineUnavailable) as crashed:
        run(pool)
    assert time.monotonic() - started < 5, "it waited for the cold-start timeout"
    assert "exit code 1" in crashed.value.message and pool.waiting == 0


def test_every_restarted_worker_loads_the_served_adapters_also_one_that_died_during_the_restart():
    crashed = StackLosingASecondWorkerDuringTheRestart(dead=True)
    pool = Pool(PoolConfig(name="p", kind="shared"), [deployment("p/0", FakeDynamoFrontend(), stack=crashed)])
    loads: list[list[int]] = []

    async def load_adapters(workers: list[WorkerHandle]) -> None:
        loads.append([w.index for w in workers])

    async def checks() -> None:
        pools = PoolSet(EngineSettings(), [pool])
        pools.prepare_workers = load_adapters
        for _ in range(2):  # the restart; the check that finds both workers ready
            await pools.check_once()

    asyncio.run(checks())
    assert loads == [[0, 1]] and pool.deployments[0].fresh_workers == set()
