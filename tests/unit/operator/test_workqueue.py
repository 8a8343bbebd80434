"""The work queue coalesces triggers and never hands one key to two workers;
pod events are batched per job."""

from __future__ import annotations

import asyncio
import copy

import kopf
from kubernetes import client

from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.controller import Controller, _identity, cached_job
from torchfleet_operator.kube import Executor
from torchfleet_operator.workqueue import WorkQueue


def run(coro):
    return asyncio.run(coro)


def test_many_adds_of_one_key_coalesce_into_one_item():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        for _ in range(65):
            queue.add("job")
        queue.add("other")
        return len(queue), [await queue.get(), await queue.get()]

    assert run(scenario()) == (2, ["job", "other"])


def test_a_key_added_while_processing_comes_back_once_after_done():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        queue.add("job")
        key = await queue.get()
        queue.add("job")
        queue.add("job")
        held_back = len(queue)  # not handed to a second worker meanwhile
        queue.done(key)
        return held_back, len(queue), await queue.get()

    assert run(scenario()) == (0, 1, "job")


def test_add_after_keeps_the_earliest_wakeup():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        queue.add_after("job", 5.0)
        queue.add_after("job", 0.05)
        queue.add_after("job", 3.0)
        await asyncio.wait_for(queue.get(), timeout=2)
        return loop.time() - start

    assert run(scenario()) < 1.0


def test_forget_cancels_a_pending_wakeup():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("job", 0.05)
        queue.forget("job")
        await asyncio.sleep(0.15)
        return len(queue)

    assert run(scenario()) == 0


def test_a_burst_of_pod_events_wakes_the_job_once_after_the_batch_period():
    async def scenario():
        config = OperatorConfig(pod_event_batch_seconds=0.5)
        controller = Controller(config, Executor(client.ApiClient(), 1), "image:1")
        for _ in range(27):  # 9 pods created, scheduled, Running
            controller.pod_changed(("team", "llm"))
            await asyncio.sleep(0)  # let the loop run between events, without a clock
        during = len(controller.queue)
        await asyncio.sleep(0.8)
        after = len(controller.queue)
        await controller.stop()
        return during, after

    assert run(scenario()) == (0, 1)


def test_the_event_of_the_operators_own_status_write_does_not_queue_the_job_again():
    """Each status write comes back as a job event; anything else in an event queues."""

    async def scenario():
        controller = Controller(OperatorConfig(), Executor(client.ApiClient(), 1), "image:1")
        seen = {
            "metadata": {"name": "llm", "namespace": "team", "uid": "u1", "generation": 1},
            "spec": {"worker": {"replicas": 2}},
        }
        written = {"phase": "Pending", "nodesReady": "0/3"}
        controller._last_status["u1"] = written
        controller._written_over["u1"] = _identity(seen)

        async def event(**changes):
            body = copy.deepcopy(seen)
            body["metadata"]["resourceVersion"] = "42"  # bookkeeping: never a change
            body["status"] = dict(written)
            for path, value in changes.items():
                section, field = path.split("__")
                body[section][field] = value
            # kopf hands over a live view, not a dict
            controller.job_changed(("team", "llm"), kopf.Body(body))
            queued = len(controller.queue)
            if queued:  # take it off again, for the next case
                controller.queue.done(await controller.queue.get())
            return queued

        outcomes = {
            "own write": await event(),
            # the apiserver bumps the generation with every change of the spec
            "spec changed": await event(spec__worker={"replicas": 3}, metadata__generation=2),
            "managed fields only": await event(metadata__managedFields=[{"manager": "x"}]),
            "label added": await event(metadata__labels={"kueue.x-k8s.io/queue-name": "q"}),
            "being deleted": await event(metadata__deletionTimestamp="2026-01-01T00:00:00Z"),
            "someone else's status": await event(status__phase="Running"),
        }
        await controller.stop()
        return outcomes

    assert run(scenario()) == {
        "own write": 0,
        "spec changed": 1,
        "managed fields only": 0,
        "label added": 1,
        "being deleted": 1,
        "someone else's status": 1,
    }


def test_the_jobs_cache_keeps_a_job_without_its_managed_fields_and_leaves_the_event_alone():
    event = {
        "metadata": {
            "name": "llm",
            "uid": "u1",
            "generation": 3,
            "managedFields": [{"manager": "torchfleet-operator", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"worker": {"replicas": 2}},
        "status": {"phase": "Running"},
    }
    before = copy.deepcopy(event)
    kept = cached_job(kopf.Body(event))
    assert kept == {
        "metadata": {"name": "llm", "uid": "u1", "generation": 3},
        "spec": {"worker": {"replicas": 2}},
        "status": {"phase": "Running"},
    }
    assert type(kept) is dict
    assert event == before
