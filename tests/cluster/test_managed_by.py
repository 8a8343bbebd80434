"""spec.managedBy against a real apiserver: a job another controller runs is
left alone (no children, no status, one event), and the field is immutable."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.api.constants import MANAGED_BY_MULTIKUEUE
from torchfleet_operator.api.reasons import EVENT_MANAGED_ELSEWHERE
from torchfleet_operator.kube import Executor
from torchfleet_operator.policy.managed import left_alone

pytestmark = pytest.mark.cluster

SELECTOR = "torchfleet.dev/job-name"


def _children(job_driver: Any, namespace: str, plural: str, group: str = "api/v1") -> list[Any]:
    listed = job_driver.raw.request(
        "GET", f"/{group}/namespaces/{namespace}/{plural}", query={"labelSelector": SELECTOR}
    )
    return list(listed["items"])


def _left_alone_events(job_driver: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in job_driver.events(namespace, name) if e["reason"] == EVENT_MANAGED_ELSEWHERE]


def test_a_job_multikueue_manages_gets_no_children_no_status_and_one_event(
    shared_operator, job_driver, cluster, namespace
):
    job = (namespace, "elsewhere")
    before = shared_operator.passes(job)
    job_driver.create(*job, spec(workers=1, managedBy=MANAGED_BY_MULTIKUEUE))
    shared_operator.wait_idle_after(before, job)

    assert job_driver.pods(namespace, "elsewhere") == []
    assert _children(job_driver, namespace, "services") == []
    assert _children(job_driver, namespace, "persistentvolumeclaims") == []
    assert "status" not in (job_driver.get(*job) or {})
    [event] = job_driver.wait_events(*job, {EVENT_MANAGED_ELSEWHERE}, type="Normal")
    assert f"spec.managedBy is {MANAGED_BY_MULTIKUEUE}" in event["message"]
    wide = cluster.kubectl("get", "tj", "elsewhere", "-n", namespace, "-o", "wide").stdout
    assert "MANAGED-BY" in wide and MANAGED_BY_MULTIKUEUE in wide

    # MultiKueue mirrors the worker's status: the pass it triggers leaves it as
    # written, creates nothing, and posts no second event.
    mirrored = {"phase": "Running", "nodesReady": "2/2", "restartCount": 0}
    before = shared_operator.passes(job)
    written = job_driver.raw.request(
        "PATCH",
        job_driver.job_path(*job) + "/status",
        {"status": mirrored},
        content_type="application/merge-patch+json",
    )
    shared_operator.wait_idle_after(before, job)
    after = job_driver.get(*job) or {}
    assert after["status"] == written["status"] and mirrored.items() <= after["status"].items()
    assert after["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert job_driver.pods(namespace, "elsewhere") == []
    assert len(_left_alone_events(job_driver, *job)) == 1

    # Its sibling without managedBy, in the same namespace, is this operator's.
    job_driver.create(namespace, "ours", spec(workers=1))
    job_driver.wait_running_pods(namespace, "ours", 2)
    assert job_driver.pods(namespace, "elsewhere") == []


def _refusal(exc: ApiException) -> str:
    return " ".join(c.get("message", "") for c in json.loads(exc.body)["details"]["causes"])


def test_managed_by_cannot_be_set_changed_or_removed_after_creation(
    operator_crd, job_driver, cluster, namespace
):
    job_driver.create(
        namespace, "other", spec(workers=1, managedBy="example.com/other", suspend=True)
    )
    job_driver.create(namespace, "plain", spec(workers=1, suspend=True))

    changed = job_driver.body("other", spec(workers=1, managedBy="example.com/else", suspend=True))
    changed["metadata"]["namespace"] = namespace
    applied = cluster.kubectl("apply", "-f", "-", input=json.dumps(changed), check=False)
    assert applied.returncode != 0
    assert "spec.managedBy" in applied.stderr and "immutable" in applied.stderr

    for name, patch in (("other", None), ("plain", "example.com/other")):
        with pytest.raises(ApiException) as refused:
            job_driver.patch(namespace, name, {"spec": {"managedBy": patch}})
        assert refused.value.status == 422
        assert "spec.managedBy" in _refusal(refused.value), refused.value.body

    assert (job_driver.get(namespace, "other") or {})["spec"]["managedBy"] == "example.com/other"
    assert "managedBy" not in (job_driver.get(namespace, "plain") or {})["spec"]


def test_the_event_is_posted_once_per_job_by_a_restarted_operator_too(
    operator_crd, job_driver, cluster, namespace
):
    """A restarted operator (or a second replica) remembers no event it posted:
    the API server refuses the second by its name, and that is no failure."""
    manager = "example.com/other"
    body = job_driver.create(namespace, "twice", spec(workers=1, managedBy=manager))
    [event] = left_alone(manager).events
    refused = {"verb": "create", "resource": "Event", "code": "409"}
    errors_before = REGISTRY.get_sample_value("torchfleet_operator_api_errors_total", refused)
    for _ in range(2):  # a first operator, then a restarted one
        executor = Executor(cluster.api_client(), 1)
        executor._post_event(namespace, body, event, "2026-01-01T00:00:00Z")
        executor.close()
    assert len(_left_alone_events(job_driver, namespace, "twice")) == 1
    errors_after = REGISTRY.get_sample_value("torchfleet_operator_api_errors_total", refused)
    assert errors_after == errors_before
