"""A cache bounded in bytes, not entries: least recently used entries go first once the sizes of its entries add
up to more than its budget.

A cache bounded by entries is bounded in memory only by its largest entry times the count, and the front door's
entries (compiled grammars, checked schemas) are as large as a client makes them. Each entry's size is the
caller's estimate (for text: its length, bytes for ASCII); an entry larger than the whole budget is not kept.
Thread-safe: grammars are compiled and cached in worker threads (rollout_server/tool_calls/grammar_cache.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING = object()


class ByteBoundedCache(Generic[K, V]):
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.size_bytes = 0                  # the sizes of the entries kept, summed
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K, default=None):
        with self._lock:
            entry = self._entries.get(key, _MISSING)
            if entry is _MISSING:
                return default
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, size_bytes: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size_bytes -= old[1]
            if size_bytes > self.budget_bytes:
                return
            self._entries[key] = (value, size_bytes)
            self.size_bytes += size_bytes
            while self.size_bytes > self.budget_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.size_bytes -= evicted
