"""The poller against hostile /metrics endpoints (real HTTP servers on loopback).

One server port, bound on several loopback addresses: each address is one
job's "master pod IP" and answers in its own way, as the pods of different
jobs would. The good job must keep updating whatever the others answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from torchfleet_contract import pod as contract
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.controller import supervise
from torchfleet_operator.scraper import ProgressPoller

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BYTES = 64 << 10
SCRAPE_SECONDS = 0.5


def scrape_errors(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "torchfleet_operator_progress_scrape_errors_total", {"reason": reason}
    )
    return value or 0.0


async def text(body: str) -> web.Response:
    return web.Response(text=body, content_type="text/plain")


async def huge(request: web.Request) -> web.StreamResponse:
    """50 MB, streamed without a length (as a broken exporter would)."""
    response = web.StreamResponse()
    await response.prepare(request)
    chunk = b"# " + b"x" * (1 << 20) + b"\n"
    try:
        for _ in range(50):
            await response.write(chunk)
    except (ConnectionError, RuntimeError):
        pass  # the poller hung up: that is the point
    return response


async def slow_loris(request: web.Request) -> web.StreamResponse:
    """A valid-looking answer, one byte at a time, for ever."""
    response = web.StreamResponse()
    await response.prepare(request)
    try:
        while True:
            await response.write(b"#")
            await asyncio.sleep(0.05)
    except (ConnectionError, RuntimeError):
        return response


HOSTILE: dict[str, Handler] = {
    "garbage": lambda r: text("\x00\xff{{{ not metrics at all"),
    "nan": lambda r: text("torchfleet_train_step NaN\n"),
    "negative": lambda r: text("torchfleet_train_step -5\ntorchfleet_train_total_steps 10\n"),
    "1e30": lambda r: text("torchfleet_train_step 1e30\n"),
    "count-no-sum": lambda r: text(
        "torchfleet_train_step 5\ntorchfleet_train_total_steps 10\n"
        "torchfleet_train_step_seconds_count 5\n"
    ),
    "huge": huge,
    "slow-loris": slow_loris,
    "http-500": lambda r: text_status(500),
}


async def text_status(code: int) -> web.Response:
    return web.Response(status=code, text="boom")


def test_one_bad_pod_never_stops_the_poller_serving_the_others():
    good_step = [1]
    addresses = {f"127.0.0.{n + 2}": name for n, name in enumerate(HOSTILE)}
    good_ip = "127.0.0.1"
    changed: list[str] = []
    before = {r: scrape_errors(r) for r in ("unparseable", "too_large", "timeout", "http")}

    async def route(request: web.Request) -> web.StreamResponse:
        ip = request.transport.get_extra_info("sockname")[0]  # type: ignore[union-attr]
        if ip == good_ip:
            return await text(f"torchfleet_train_step {good_step[0]}\n")
        return await HOSTILE[addresses[ip]](request)

    async def scenario() -> ProgressPoller[str]:
        app = web.Application()
        app.router.add_get("/metrics", route)
        runner = web.AppRunner(app)
        await runner.setup()
        first = web.TCPSite(runner, good_ip, 0)
        await first.start()
        port = first._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        for ip in addresses:
            await web.TCPSite(runner, ip, port).start()
        jobs = [("good", good_ip)] + [(name, ip) for ip, name in addresses.items()]
        poller: ProgressPoller[str] = ProgressPoller(
            0.05,
            lambda: jobs,
            changed.append,
            port=port,
            max_bytes=MAX_BYTES,
            scrape_seconds=SCRAPE_SECONDS,
        )
        task = asyncio.create_task(poller.run())
        try:
            # The good job updates again and again while every hostile one has
            # been scraped (and failed) at least once, the slow ones included.
            while good_step[0] < 5 or _pending(before):
                progress, _ = poller.latest.get("good", (None, None))
                if progress is not None and progress["step"] == good_step[0]:
                    good_step[0] += 1  # seen: the pod moves on
                assert not task.done(), task
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            await runner.cleanup()
        return poller

    poller = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert changed.count("good") >= 4
    # A _count without its _sum is progress without an ETA, not a crash.
    count_no_sum, _ = poller.latest["count-no-sum"]
    assert count_no_sum is not None and "etaSeconds" not in count_no_sum
    # Nothing out of range became progress: a step that is no step is "no progress".
    for name in ("nan", "negative", "1e30"):
        assert name not in poller.latest, name
    # Failed scrapes back off instead of being retried every tick.
    for name in ("garbage", "huge", "slow-loris", "http-500"):
        assert name not in poller.latest, name
        assert name in poller._retry_at, name


def _pending(before: dict[str, float]) -> bool:
    return any(scrape_errors(reason) <= count for reason, count in before.items())


def test_supervise_restarts_a_task_that_raises_and_counts_it():
    calls: list[int] = []

    def restarts() -> float:
        value = REGISTRY.get_sample_value(
            "torchfleet_operator_task_restarts_total", {"task": "flaky"}
        )
        return value or 0.0

    before = restarts()

    async def scenario() -> None:
        alive = asyncio.Event()

        async def flaky() -> None:
            calls.append(len(calls))
            if len(calls) <= 2:
                raise RuntimeError("a bug in the poller")
            alive.set()
            await asyncio.Event().wait()  # the third run stays up

        task = asyncio.create_task(supervise("flaky", flaky, backoff=0.01))
        await alive.wait()
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # cancellation still stops it: the operator can shut down

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert len(calls) == 3
    assert restarts() - before == 2


def test_progress_port_defaults_to_the_contracts_and_must_be_a_port():
    assert OperatorConfig.from_env({}).progress_port == contract.DEFAULT_METRICS_PORT
    assert (
        OperatorConfig.from_env({"TORCHFLEET_OPERATOR_PROGRESS_PORT": "9500"}).progress_port == 9500
    )
    with pytest.raises(ValueError, match="TORCHFLEET_OPERATOR_PROGRESS_PORT must be a TCP port"):
        OperatorConfig.from_env({"TORCHFLEET_OPERATOR_PROGRESS_PORT": "70000"})
