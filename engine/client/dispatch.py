"""The front door's way to the engines: a request goes to a healthy deployment of its pool.

A request that a deployment refused before any output (`RefusedBeforeOutput`, engine/errors.py) is sent again: at
once to a deployment of the pool that has refused it fewer times, when there is one (failover), else
after a pause that doubles each round (Dynamo drops a dead worker from discovery within about a second;
the supervisor restarts a dead process in tens of seconds). A stream that already produced tokens is
never sent again: the client gets a retryable error event instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from typing import AsyncIterator

from engine.client.dynamo_http import DynamoFrontendClient
from engine.client.embedded_router import EmbeddedRouterClient
from engine.contract import EngineChunk, EngineClient, EngineRequest
from engine.errors import RefusedBeforeOutput
from engine.supervisor.pools import PoolSet
from engine.supervisor.stack import Stack

log = logging.getLogger(__name__)


class Dispatcher:
    """`retries`: how many times a request every deployment refused is sent again, after pauses of
    `retry_delay_s`, doubling up to `max_retry_delay_s` (the defaults wait about 12 s in all)."""

    def __init__(self, pools: PoolSet, retries: int = 6, retry_delay_s: float = 0.25, max_retry_delay_s: float = 4.0):
        self.pools = pools
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.max_retry_delay_s = max_retry_delay_s

    async def stream(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        pool = self.pools.pools[req.pool]
        pool.in_flight += 1
        pool.last_active = time.monotonic()
        refusals: Counter[str] = Counter()   # deployment name -> times it refused this request
        pauses = 0
        try:
            while True:
                deployment = await self.pools.pick(pool, req.session_id, refusals)
                deployment.in_flight += 1
                try:
                    async for chunk in deployment.client.stream_once(req):
                        yield chunk
                    return
                except RefusedBeforeOutput as refused:
                    refusal = refused.error
                finally:
                    deployment.in_flight -= 1
                refusals[deployment.name] += 1
                self.pools.refused(deployment)
                other = self.pools.least_refused(pool, refusals)[0]
                if refusals[other.name] < refusals[deployment.name]:
                    pool.failovers += 1
                    log.warning("request %s: %s refused it (%s); failing over to %s", req.request_id,
                                deployment.name, refusal.message, other.name)
                    continue
                if pauses == self.retries:
                    raise refusal
                delay = min(self.retry_delay_s * 2 ** pauses, self.max_retry_delay_s)
                pauses += 1
                log.info("request %s refused by %s (%s); sending it again in %.2g s (retry %d of %d)",
                         req.request_id, deployment.name, refusal.message, delay, pauses, self.retries)
                await asyncio.sleep(delay)
        finally:
            pool.in_flight -= 1
            pool.last_active = time.monotonic()

    async def close(self) -> None:
        await self.pools.close()


def client_for(stack: Stack) -> EngineClient:
    """How the front door reaches a deployment's workers: Dynamo's KV router in its own process for aggregated
    workers routed by KV (engine/client/embedded_router.py), else Dynamo's frontend over HTTP."""
    settings = stack.settings
    if not settings.embedded_router or settings.router_mode != "kv" or settings.disaggregation.enabled:
        return DynamoFrontendClient(stack.frontend_url, settings.request_timeout_s)
    tier = settings.kv_tier
    return EmbeddedRouterClient(
        env={**stack.dynamo_env(), "DYN_LOG": os.environ.get("DYN_LOG", "warn")},  # not a log line per request
        discovery_backend=settings.discovery_backend, model_dir=stack.model_dir,
        served_model_name=stack.served_model_name, block_size=settings.block_size,
        session_affinity_ttl_s=settings.session_affinity_ttl_s,
        host_cache_hit_weight=tier.router_host_weight if tier.enabled else None, timeout_s=settings.request_timeout_s,
        # Dynamo's mocker hashes its blocks without the team's salt (it keeps no one's KV): the router does the same
        salted_routing=not settings.mocker_workers)
