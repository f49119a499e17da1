"""Values read from the database, each trusted for a while, then read again off the event loop.

The front door's settings tables (API keys, rate limits) are changed by `rollout-serve keys` in another
process. A value read is trusted for `ttl_s`; the next use after that reads it again, in a worker thread,
so the event loop that carries every stream never waits for the database (on Postgres, a network round
trip), and a change reaches a running server within `ttl_s`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadCache(Generic[K, V]):
    def __init__(self, ttl_s: float, keep: Callable[[V], bool] = lambda value: True,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.keep = keep  # values not kept are read again on every use (e.g. unknown keys: memory stays bounded)
        self.clock = clock
        self._values: dict[K, tuple[V, float]] = {}

    async def get(self, key: K, read: Callable[[], V]) -> V:
        known = self._values.get(key)
        if known is not None and self.clock() - known[1] < self.ttl_s:
            return known[0]
        value = await asyncio.to_thread(read)
        if self.keep(value):
            self._values[key] = (value, self.clock())
        else:
            self._values.pop(key, None)
        return value

    def forget(self, key: K) -> None:
        self._values.pop(key, None)
