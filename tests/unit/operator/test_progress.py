"""Progress comes from the trainer's own /metrics server (a real one, on loopback)."""

from __future__ import annotations

import asyncio

from tests.fixtures.poll import async_wait_for
from torchfleet_operator.scraper import ProgressPoller
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer.metrics import TrainMetrics


def test_poller_reads_the_trainers_gauges_and_reports_only_changes():
    metrics = TrainMetrics()
    port = metrics.serve(0)
    metrics.step.set(40)
    metrics.loss.set(2.25)
    metrics.tokens_per_second.set(1234.5)
    metrics.step_seconds.observe(0.5)  # a step timed, as the trainer reports each one
    changed: list[str] = []

    async def scenario() -> None:
        poller: ProgressPoller[str] = ProgressPoller(
            0.05, lambda: [("llm", "127.0.0.1")], changed.append, port=port
        )
        task = asyncio.create_task(poller.run())
        await async_wait_for("the first change", lambda: changed)
        await asyncio.sleep(0.3)  # several more scrapes of unchanged figures
        assert changed == ["llm"]
        progress, _ = poller.latest["llm"]
        assert progress is not None
        assert (progress["step"], progress["loss"], progress["tokensPerSecond"]) == (
            40,
            2.25,
            1234.5,
        )
        metrics.step.set(41)
        await async_wait_for("the second change", lambda: len(changed) >= 2)
        task.cancel()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_unreachable_master_backs_off_and_reports_nothing():
    changed: list[str] = []

    async def scenario() -> ProgressPoller[str]:
        # Port 9 (discard) on loopback: connection refused at once.
        poller: ProgressPoller[str] = ProgressPoller(
            0.05, lambda: [("llm", "127.0.0.1")], changed.append, port=9
        )
        task = asyncio.create_task(poller.run())
        await asyncio.sleep(0.4)
        task.cancel()
        return poller

    poller = asyncio.run(scenario())
    assert changed == [] and "llm" not in poller.latest
    _, backoff, _ = poller._retry_at["llm"]
    assert backoff >= 0.1  # doubled at least once, not retried every tick
    assert backoff <= 4 * 0.05  # but capped at a few intervals: a slow start is not missed


def test_new_master_ip_is_tried_at_once_despite_the_old_back_off():
    poller: ProgressPoller[str] = ProgressPoller(15, lambda: [], lambda key: None)
    far = 1e12
    poller._retry_at["llm"] = (far, 60.0, "10.0.0.1")
    assert not poller._due("llm", "10.0.0.1", now=0.0)
    assert poller._due("llm", "10.0.0.2", now=0.0)  # gang restarted: a new master


def test_percent_and_eta_need_a_total_step_count():
    text = (
        "torchfleet_train_step 50\ntorchfleet_train_total_steps 200\n"
        "torchfleet_train_step_seconds_sum 10\ntorchfleet_train_step_seconds_count 50\n"
        "torchfleet_checkpoint_step 40\n"
    )
    progress, checkpoint = progress_from_metrics(text, "t")
    assert progress == {
        "step": 50,
        "updateTime": "t",
        "source": "Metrics",
        "totalSteps": 200,
        "percent": 25,
        "etaSeconds": 30,
    }
    assert checkpoint == 40
    assert progress_from_metrics("other_metric 1\n", "t") == (None, None)
