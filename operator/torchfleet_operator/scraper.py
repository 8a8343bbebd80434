"""Reads training progress from each running job's master pod (``/metrics``).

An asyncio task on the operator's loop: every interval it GETs the master's
metrics endpoint (pod IP + the contract's metrics port) for each Running
job, concurrently and with a short timeout, and queues the job when the
figures changed. A pod that does not answer (KWOK pods have no endpoint, a
script may export nothing) is tried again later with a growing back-off,
capped at a few intervals so a slow start-up is not missed, and reset when the
master changes (a gang restart); failures are never an error.

The endpoint is untrusted: each scrape is capped in size and time, and any
exception it raises stays with that job (counted by reason in
torchfleet_operator_progress_scrape_errors_total), so one bad pod never
stops the poller serving the others. The controller restarts the task should
it ever die all the same.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import aiohttp

from torchfleet_contract import pod as contract
from torchfleet_operator import metrics
from torchfleet_operator.observed import GangHealth, timestamp
from torchfleet_operator.status.progress import MetricsError, scrape_from_metrics

log = logging.getLogger(__name__)
MAX_BACKOFF_INTERVALS = 4
CONCURRENT_SCRAPES = 64
# A pod's /metrics is untrusted: a scrape reads at most this much, for at most
# this long (a slow-loris trickling bytes included), then gives up.
MAX_RESPONSE_BYTES = 1 << 20
SCRAPE_SECONDS = 2.0
# A pod that keeps answering garbage is reported once a minute, not every tick.
WARN_EVERY_SECONDS = 60.0
CHUNK_BYTES = 64 << 10


class ResponseTooLarge(Exception):
    """The metrics response passed MAX_RESPONSE_BYTES."""


K = TypeVar("K", bound=Hashable)


class ProgressPoller(Generic[K]):
    def __init__(
        self,
        interval: float,
        targets: Callable[[], Iterable[tuple[K, str]]],
        on_change: Callable[[K], None],
        port: int = contract.DEFAULT_METRICS_PORT,
        max_bytes: int = MAX_RESPONSE_BYTES,
        scrape_seconds: float = SCRAPE_SECONDS,
    ) -> None:
        self.interval = interval
        self.targets = targets  # (job key, master pod IP) of running jobs
        self.on_change = on_change
        self.port = port
        self.max_bytes = max_bytes
        self.scrape_seconds = scrape_seconds
        self.latest: dict[K, tuple[dict[str, Any] | None, int | None]] = {}
        # The gang's node health from the same scrape (status/node_health.py).
        self.health: dict[K, GangHealth] = {}
        # key -> (next try, current back-off, the master IP it applies to)
        self._retry_at: dict[K, tuple[float, float, str]] = {}
        self._warned_at: dict[K, float] = {}

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.scrape_seconds, connect=1)
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
        """One job's scrape; whatever goes wrong stays with this job (never raises)."""
        try:
            async with (
                limit,
                asyncio.timeout(self.scrape_seconds),
            ):  # aiohttp's too, belt and braces
                text = await self._fetch(session, ip)
            # Parsing up to MAX_RESPONSE_BYTES of text takes long enough to stall
            # kopf's watches if done on the loop: it runs in a worker thread.
            progress, checkpoint, health = await asyncio.to_thread(
                scrape_from_metrics, text, timestamp(datetime.now(UTC))
            )
            self._retry_at.pop(key, None)
            if progress is None:
                return
            found = (progress, checkpoint)
            previous = self.latest.get(key), self.health.get(key)
            self.latest[key] = found
            if health is None:
                self.health.pop(key, None)
            else:
                self.health[key] = health
            changed = previous[0] is None or _figures(previous[0]) != _figures(found)
            if changed or _health_figures(previous[1]) != _health_figures(health):
                self.on_change(key)
        except Exception as exc:
            self._failed(key, ip, exc)

    async def _fetch(self, session: aiohttp.ClientSession, ip: str) -> str:
        """The body, streamed and capped (a 50 MB answer is never buffered)."""
        host = f"[{ip}]" if ":" in ip else ip
        async with session.get(f"http://{host}:{self.port}/metrics") as response:
            response.raise_for_status()
            body = bytearray()
            if (response.content_length or 0) <= self.max_bytes:
                async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                    body += chunk
                    if len(body) > self.max_bytes:
                        break
            if len(body) > self.max_bytes or (response.content_length or 0) > self.max_bytes:
                response.close()  # drop the connection: the rest is never read
                raise ResponseTooLarge(f"more than {self.max_bytes} bytes")
        return body.decode("utf-8")

    def _failed(self, key: K, ip: str, exc: Exception) -> None:
        """Counts the failure, backs this job off, and logs without flooding."""
        reason = scrape_error_reason(exc)
        metrics.PROGRESS_SCRAPE_ERRORS.labels(reason=reason).inc()
        _, backoff, _ = self._retry_at.get(key, (0.0, self.interval / 2, ip))
        backoff = min(MAX_BACKOFF_INTERVALS * self.interval, backoff * 2)
        now = time.monotonic()
        self._retry_at[key] = (now + backoff, backoff, ip)
        # No endpoint (yet) is normal: KWOK pods, a script that exports nothing.
        quiet = reason in ("unreachable", "http", "timeout")
        if quiet or now - self._warned_at.get(key, -math.inf) < WARN_EVERY_SECONDS:
            log.debug("no progress from %s (%s: %s); next try in %.0fs", ip, reason, exc, backoff)
            return
        self._warned_at[key] = now
        log.warning(
            "no progress from %s for %s (%s: %s); said at most once a minute",
            ip,
            key,
            reason,
            exc,
            exc_info=reason == "unexpected",
        )

    def _due(self, key: K, ip: str, now: float) -> bool:
        retry = self._retry_at.get(key)
        # A new master IP is a new gang: the old one's back-off does not apply.
        return retry is None or retry[2] != ip or retry[0] <= now

    def forget(self, key: K) -> None:
        self.latest.pop(key, None)
        self.health.pop(key, None)
        self._retry_at.pop(key, None)
        self._warned_at.pop(key, None)


def scrape_error_reason(exc: BaseException) -> str:
    """The metric label for a failed scrape."""
    if isinstance(exc, ResponseTooLarge):
        return "too_large"
    if isinstance(exc, TimeoutError):  # asyncio's and aiohttp's timeouts both are
        return "timeout"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "http"
    if isinstance(exc, aiohttp.ClientError):
        return "unreachable"
    if isinstance(exc, MetricsError | UnicodeDecodeError):
        return "unparseable"
    return "unexpected"


def _figures(found: tuple[dict[str, Any] | None, int | None]) -> tuple[Any, ...]:
    """The scrape minus its timestamp: an unchanged step is not worth a status write."""
    progress, checkpoint = found
    return (
        tuple(sorted((k, v) for k, v in (progress or {}).items() if k != "updateTime")),
        checkpoint,
    )


def _health_figures(health: GangHealth | None) -> tuple[Any, ...]:
    """A new log interval's node figures, or a new phase, is worth a pass."""
    if health is None:
        return ()
    return (health.window, health.phase, health.phase_started, health.restarts_in_gang)
