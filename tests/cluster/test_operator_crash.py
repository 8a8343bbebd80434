"""Operators started per test (no shared one): a crash mid-creation, and back-off.

These tests need to be the only operator acting on their jobs, so the module
starts its own processes and uses no module-wide operator.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster


def test_operator_killed_while_creating_64_workers_recovers_exactly(
    operator_factory, job_driver, namespace
):
    # One API call at a time, so the kill lands in the middle of the gang.
    slow = operator_factory(env={"TORCHFLEET_OPERATOR_API_CONCURRENCY": "1"})
    job_driver.create(namespace, "big", spec(workers=64))
    job_driver.wait_for(
        "the first pods", lambda: len(job_driver.pods(namespace, "big")) >= 5, interval=0.02
    )
    slow.kill()
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in job_driver.pods(namespace, "big")
    }
    assert 5 <= len(before) < 65, "the kill must interrupt the creation"

    operator_factory()
    pods = job_driver.wait_running_pods(namespace, "big", 65, timeout=120)
    assert job_driver.wait_phase(namespace, "big", "Running", timeout=60)["restartCount"] == 0
    expected = {"big-master-0", *(f"big-worker-{i}" for i in range(64))}
    assert {p["metadata"]["name"] for p in pods} == expected
    assert len(job_driver.pods(namespace, "big")) == 65  # no duplicates, none extra
    # Pods made before the crash were kept, not recreated.
    survivors = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    assert all(survivors[name] == uid for name, uid in before.items())


def test_pods_the_apiserver_forbids_show_its_message_back_off_and_run_once_allowed(
    operator_factory, job_driver, cluster, namespace
):
    """A 403 (quota here, Pod Security alike) can pass later: retried with
    back-off, never a hot loop, never a failed job. (A 400/422 cannot: the job
    fails, test_pod_dry_run.py.)"""
    # An operator of its own, for this namespace only: its error count is this job's.
    operator = operator_factory(namespaces=[namespace])
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(quota))
    job_driver.create(namespace, "llm", spec(workers=1))
    rejected = job_driver.wait_for(
        "the ChildrenRejected condition",
        lambda: (
            (
                found := find(
                    job_driver.status(namespace, "llm").get("conditions"), "ChildrenRejected"
                )
            )
            and found["status"] == "True"
            and found
        ),
    )
    assert rejected["reason"] == "CreateRejected", rejected
    assert "forbidden" in rejected["message"] and "llm-" in rejected["message"], rejected
    assert job_driver.live_pods(namespace, "llm") == []
    errors = operator.metric("torchfleet_operator_api_errors_total", resource="Pod", code="403")
    assert errors >= 1
    # Back-off (0.5 s doubling in tests) despite the job's own events: the
    # next two retries (each refuses both pods) take a second or more, not a hot loop.
    started = time.monotonic()
    job_driver.wait_for(
        "two more refused retries",
        lambda: (
            operator.metric("torchfleet_operator_api_errors_total", resource="Pod", code="403")
            >= errors + 4
        ),
        timeout=30,
    )
    assert time.monotonic() - started >= 0.8
    assert job_driver.status(namespace, "llm").get("phase") != "Failed"
    # Allowed again: the retries go on, and the gang runs.
    cluster.kubectl("delete", "resourcequota", "no-pods", "-n", namespace)
    job_driver.wait_running_pods(namespace, "llm", 2, timeout=60)


def test_the_restart_bump_is_stored_before_the_old_gang_is_deleted(
    operator_factory, job_driver, namespace, cluster
):
    """A crash between the two must not lose the restart: the apiserver's own order
    of writes (etcd revisions, one etcd here) shows the status write came first."""
    import threading

    from kubernetes import client, watch

    operator_factory(namespaces=[namespace])
    api = cluster.api_client()
    job_driver.create(namespace, "llm", spec(workers=1, runPolicy={"restartPolicy": "OnFailure"}))
    job_driver.wait_running_pods(namespace, "llm", 2)
    start = job_driver.get(namespace, "llm")["metadata"]["resourceVersion"]
    seen: list[tuple[int, str, dict]] = []
    stop = threading.Event()

    def follow(kind: str, list_call, **kwargs) -> None:
        stream = watch.Watch()
        for event in stream.stream(
            list_call, namespace=namespace, resource_version=start, timeout_seconds=60, **kwargs
        ):
            obj = event["object"]
            obj = obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)
            seen.append((int(obj["metadata"]["resourceVersion"]), kind, obj))
            if stop.is_set():
                stream.stop()

    custom = client.CustomObjectsApi(api)
    threads = [
        threading.Thread(
            target=follow,
            args=("job", custom.list_namespaced_custom_object),
            kwargs={"group": "torchfleet.dev", "version": "v1alpha1", "plural": "trainingjobs"},
            daemon=True,
        ),
        threading.Thread(
            target=follow, args=("pod", client.CoreV1Api(api).list_namespaced_pod), daemon=True
        ),
    ]
    for thread in threads:
        thread.start()
    job_driver.fail_pod(namespace, "llm-worker-0", exit_code=1)
    job_driver.wait_running_pods(namespace, "llm", 2, restart=1)
    stop.set()
    # One more event on each watch, so that both streams see the stop.
    job_driver.patch(namespace, "llm", {"metadata": {"labels": {"done": "yes"}}})
    job_driver.patch_pod(namespace, "llm-master-0", {"metadata": {"labels": {"done": "yes"}}})
    for thread in threads:
        thread.join(timeout=70)

    bumped = min(
        rv
        for rv, kind, obj in seen
        if kind == "job" and (obj.get("status") or {}).get("restartCount") == 1
    )
    old_gang_deleted = min(
        rv
        for rv, kind, obj in seen
        if kind == "pod"
        and obj["metadata"]["labels"].get("torchfleet.dev/restart") == "0"
        and obj["metadata"].get("deletionTimestamp")
    )
    assert bumped < old_gang_deleted, (bumped, old_gang_deleted)


def test_a_passs_events_are_posted_after_its_status_write_landed(
    operator_factory, job_driver, namespace, cluster
):
    """An event says what the status already records: `kubectl describe` never
    shows "GangRunning" over a status that still says Pending. The apiserver's
    order of writes (etcd revisions, one etcd here) shows which came first."""
    import threading

    from kubernetes import client, watch

    api = cluster.api_client()
    custom = client.CustomObjectsApi(api)
    listed = custom.list_namespaced_custom_object(
        "torchfleet.dev", "v1alpha1", namespace, "trainingjobs"
    )
    start = listed["metadata"]["resourceVersion"]
    running_written: list[int] = []
    stream = watch.Watch()

    def follow() -> None:
        for event in stream.stream(
            custom.list_namespaced_custom_object,
            "torchfleet.dev",
            "v1alpha1",
            namespace,
            "trainingjobs",
            resource_version=start,
            timeout_seconds=60,
        ):
            job = event["object"]
            if (job.get("status") or {}).get("phase") == "Running":
                running_written.append(int(job["metadata"]["resourceVersion"]))
                stream.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    operator_factory(namespaces=[namespace])
    job_driver.create(namespace, "llm", spec(workers=1))
    (event,) = [
        e
        for e in job_driver.wait_events(namespace, "llm", {"GangRunning"})
        if e["reason"] == "GangRunning"
    ]
    thread.join(timeout=60)
    assert running_written, "the watch never saw the Running status"
    assert running_written[0] < int(event["metadata"]["resourceVersion"])
