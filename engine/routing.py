"""The front door's way to the engines: a request goes to a healthy deployment of its pool.

A request that a deployment refused before any output (engine/frontend_client.py) is sent again: at
once to another healthy deployment of the pool when there is one (failover), else to the same one
after a short wait (Dynamo drops a dead worker from discovery within about a second). A stream that
already produced tokens is never sent again: the client gets a retryable error event instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from engine.frontend_client import EngineChunk, EngineRequest, RefusedBeforeOutput
from engine.pools import PoolSet

log = logging.getLogger(__name__)


class PoolRouter:
    def __init__(self, pools: PoolSet, retries: int = 3, retry_delay_s: float = 0.5):
        self.pools = pools
        self.retries = retries
        self.retry_delay_s = retry_delay_s

    async def stream(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        pool = self.pools.pools[req.pool]
        pool.in_flight += 1
        pool.last_active = time.monotonic()
        refused_by: set[str] = set()
        try:
            for attempt in range(1, self.retries + 2):
                deployment = await self.pools.pick(pool, req.session_id, avoid=refused_by)
                try:
                    async for chunk in deployment.client.stream_once(req):
                        yield chunk
                    return
                except RefusedBeforeOutput as refused:
                    if attempt > self.retries:
                        raise refused.error from None
                    refused_by.add(deployment.name)
                    self.pools.refused(deployment)
                    others = [d for d in pool.serving() if d.name not in refused_by]
                    if others:
                        pool.failovers += 1
                        log.warning("request %s: %s refused it (%s); failing over to %s", req.request_id,
                                    deployment.name, refused.error.message, others[0].name)
                        continue
                    log.info("request %s refused by %s (%s); sending it again (attempt %d of %d)", req.request_id,
                             deployment.name, refused.error.message, attempt + 1, self.retries + 1)
                    await asyncio.sleep(self.retry_delay_s * attempt)
        finally:
            pool.in_flight -= 1
            pool.last_active = time.monotonic()

    async def close(self) -> None:
        await self.pools.close()
