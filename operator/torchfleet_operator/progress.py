"""Reads training progress from each running job's master pod (``/metrics``).

An asyncio task on the operator's loop: every interval it GETs the master's
metrics endpoint (pod IP + the contract's metrics port) for each Running
job, concurrently and with a short timeout, and queues the job when the
figures changed. A pod that does not answer (KWOK pods have no endpoint, a
script may export nothing) is tried again later with a growing back-off,
capped at a few intervals so a slow start-up is not missed, and reset when the
master changes (a gang restart); failures are never an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import aiohttp

from torchfleet_operator.reconcile import timestamp
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer import contract

log = logging.getLogger(__name__)
MAX_BACKOFF_INTERVALS = 4
CONCURRENT_SCRAPES = 64


K = TypeVar("K", bound=Hashable)


class ProgressPoller(Generic[K]):
    def __init__(
        self,
        interval: float,
        targets: Callable[[], Iterable[tuple[K, str]]],
        on_change: Callable[[K], None],
        port: int = contract.DEFAULT_METRICS_PORT,
    ) -> None:
        self.interval = interval
        self.targets = targets  # (job key, master pod IP) of running jobs
        self.on_change = on_change
        self.port = port
        self.latest: dict[K, tuple[dict[str, Any] | None, int | None]] = {}
        # key -> (next try, current back-off, the master IP it applies to)
        self._retry_at: dict[K, tuple[float, float, str]] = {}

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2, connect=1)
        limit = asyncio.Semaphore(CONCURRENT_SCRAPES)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await asyncio.sleep(self.interval)
                now = time.monotonic()
                due = [(k, ip) for k, ip in self.targets() if self._due(k, ip, now)]
                await asyncio.gather(*(self._scrape(session, limit, k, ip) for k, ip in due))

    async def _scrape(
        self, session: aiohttp.ClientSession, limit: asyncio.Semaphore, key: K, ip: str
    ) -> None:
        host = f"[{ip}]" if ":" in ip else ip
        try:
            async with limit, session.get(f"http://{host}:{self.port}/metrics") as response:
                response.raise_for_status()
                text = await response.text()
            found = progress_from_metrics(text, timestamp(datetime.now(UTC)))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            _, backoff, _ = self._retry_at.get(key, (0.0, self.interval / 2, ip))
            backoff = min(MAX_BACKOFF_INTERVALS * self.interval, backoff * 2)
            self._retry_at[key] = (time.monotonic() + backoff, backoff, ip)
            log.debug("no progress from %s (%s); next try in %.0fs", ip, exc, backoff)
            return
        self._retry_at.pop(key, None)
        if found[0] is None:
            return
        previous = self.latest.get(key)
        self.latest[key] = found
        if previous is None or _figures(previous) != _figures(found):
            self.on_change(key)

    def _due(self, key: K, ip: str, now: float) -> bool:
        retry = self._retry_at.get(key)
        # A new master IP is a new gang: the old one's back-off does not apply.
        return retry is None or retry[2] != ip or retry[0] <= now

    def forget(self, key: K) -> None:
        self.latest.pop(key, None)
        self._retry_at.pop(key, None)


def _figures(found: tuple[dict[str, Any] | None, int | None]) -> tuple[Any, ...]:
    """The scrape minus its timestamp: an unchanged step is not worth a status write."""
    progress, checkpoint = found
    return (
        tuple(sorted((k, v) for k, v in (progress or {}).items() if k != "updateTime")),
        checkpoint,
    )
