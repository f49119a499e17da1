"""A bounded FIFO from many producers (threads or asyncio tasks) to one consumer thread.

Producers on an event loop wait for room without blocking the loop: they park on an
asyncio future that the consumer wakes (thread-safely) each time it takes items.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque


class HandoffClosed(RuntimeError):
    pass


class Handoff:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def try_put(self, item) -> bool:
        with self._lock:
            return self._append_if_room(item)

    def put(self, item) -> None:
        """Blocks the calling thread until there is room."""
        with self._lock:
            while not self._append_if_room(item):
                self._not_full.wait()

    async def put_async(self, item) -> None:
        """Waits (asynchronously) until there is room."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._append_if_room(item):
                    return
                room = loop.create_future()
                self._async_waiters.append((loop, room))
            await room

    def take_batch(self, max_items: int, timeout: float) -> list:
        """Up to max_items items; waits up to timeout seconds for the first one."""
        with self._lock:
            if not self._items and not self.closed:
                self._not_empty.wait(timeout)
            batch = [self._items.popleft() for _ in range(min(max_items, len(self._items)))]
            if batch:
                self._wake_producers()
            return batch

    def close(self) -> None:
        """Refuses new items; the consumer still drains what is queued."""
        with self._lock:
            self.closed = True
            self._not_empty.notify_all()
            self._wake_producers()

    def _append_if_room(self, item) -> bool:
        if self.closed:
            raise HandoffClosed("trace capture is closed")
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        self._not_empty.notify()
        return True

    def _wake_producers(self) -> None:
        self._not_full.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, room in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, room)
            except RuntimeError:
                pass   # that event loop is closed: nobody is waiting any more


def _resolve(room: asyncio.Future) -> None:
    if not room.done():
        room.set_result(None)
