"""A coalescing, delaying work queue of job keys (client-go's workqueue, in asyncio).

Every trigger (job event, pod event, node event, timer) only *adds a key*; the
workers reconcile keys. That gives the operator its two key properties:

* one reconcile path: whatever happened, the same function runs for the key;
* coalescing: 65 pod events arriving while a job is being reconciled produce
  one more pass, not 65, and one key is never reconciled by two workers at once.

Must be used from one event loop (it is not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()  # in _ready, not yet taken
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added again while processing
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: K) -> None:
        """Queue ``key`` now, unless it is queued already."""
        self._loop = self._loop or asyncio.get_running_loop()
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds; an earlier pending wake-up wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = self._loop = self._loop or asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None and not pending.cancelled():
            if pending.when() <= when:
                return
            pending.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        """The next key; the caller owns it until ``done(key)``."""
        self._loop = self._loop or asyncio.get_running_loop()
        key = await self._ready.get()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """Drops a pending delayed wake-up (e.g. the job was deleted)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
