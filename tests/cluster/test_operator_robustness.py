"""Crash safety, isolation, gang scheduling and node loss, against a real apiserver."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import wait_crd_established
from tests.fixtures.operator import fake_node
from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster

PODGROUP_CRDS = Path(__file__).parent / "podgroup-crds"


def test_jobs_in_two_namespaces_never_touch_each_others_pods(
    shared_operator, job_driver, cluster, namespace
):
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        for ns in (namespace, other):
            job_driver.create(ns, "same", spec(workers=1))
        job_driver.wait_running_pods(namespace, "same", 2)
        untouched = {p["metadata"]["uid"] for p in job_driver.wait_running_pods(other, "same", 2)}
        job_driver.fail_pod(namespace, "same-worker-0", exit_code=137)
        job_driver.wait_running_pods(namespace, "same", 2, restart=1)
        assert {p["metadata"]["uid"] for p in job_driver.live_pods(other, "same")} == untouched
        assert job_driver.status(other, "same")["restartCount"] == 0
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_odd_objects_the_apiserver_accepts_never_stall_the_operator(
    shared_operator, job_driver, namespace
):
    odd = {
        "minimal": {},
        "huge-suspended": {"worker": {"replicas": 4095}, "suspend": True},
        # The CRD's PodSpec schema cannot see that the volume is missing; the pods'
        # own validation does, and the job reports it in the API server's words.
        "mount-without-volume": spec(
            workers=1,
            template={
                "spec": {
                    "nodeSelector": {"torchfleet.dev/fake-node": "true"},
                    "containers": [
                        {"name": "trainer", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}
                    ],
                }
            },
        ),
        "odd-template-types": spec(
            workers=1,
            template={
                "metadata": {"labels": {"x": "y"}},
                "spec": {
                    "nodeSelector": {"torchfleet.dev/fake-node": "true"},
                    "volumes": [{"name": "dshm", "emptyDir": {}}],
                },
            },
        ),
    }
    for name, body in odd.items():
        job_driver.create(namespace, name, body)
    # Each gets a status, and the event loop keeps answering its liveness probe
    # (kopf serves it from the same loop that a blocking call would stall).
    for name in odd:
        job_driver.wait_for(
            f"a phase on {name}", lambda n=name: job_driver.status(namespace, n).get("phase")
        )
        assert shared_operator.healthy(timeout=10)
    assert job_driver.status(namespace, "huge-suspended")["phase"] == "Suspended"
    job_driver.wait_for(
        "a condition naming the missing volume",
        lambda: any(
            '"nope"' in (c.get("message") or "")
            for c in job_driver.status(namespace, "mount-without-volume").get("conditions", [])
        ),
    )
    assert shared_operator.metric("torchfleet_operator_reconcile_errors_total") == 0
    assert shared_operator.process.poll() is None


def test_pod_group_for_the_gang_and_a_condition_when_its_crd_is_missing(
    shared_operator, job_driver, cluster, namespace
):
    cluster.kubectl("delete", "crd", "podgroups.scheduling.volcano.sh", "--ignore-not-found")
    job_driver.create(
        namespace,
        "gang",
        spec(workers=3, scheduling={"podGroup": "Volcano", "queueName": "research"}),
    )
    missing = job_driver.wait_for(
        "the PodGroupCRDMissing condition",
        lambda: next(
            (
                c
                for c in job_driver.status(namespace, "gang").get("conditions", [])
                if c.get("reason") == "PodGroupCRDMissing"
            ),
            None,
        ),
    )
    assert "spec.scheduling.podGroup" in missing["message"]
    assert job_driver.pods(namespace, "gang") == []  # no pods without their gang

    cluster.kubectl("apply", "-f", str(PODGROUP_CRDS))
    for crd in ("podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io"):
        wait_crd_established(cluster.kubectl, crd)
    group = job_driver.wait_for(
        "the Volcano PodGroup",
        lambda: job_driver.raw.request(
            "GET", f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups"
        )["items"],
        timeout=60,
    )[0]
    assert group["spec"]["minMember"] == 4 and group["spec"]["queue"] == "research"
    pods = job_driver.wait_for(
        "the gang's pods",
        lambda: len(p := job_driver.pods(namespace, "gang")) == 4 and p,
        timeout=60,
    )
    assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}
    assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in pods} == {"gang"}

    job_driver.create(
        namespace, "cosched", spec(workers=1, scheduling={"podGroup": "Coscheduling"})
    )
    job_driver.wait_running_pods(namespace, "cosched", 2)
    cosched = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/cosched"
    assert job_driver.raw.request("GET", cosched)["spec"]["minMember"] == 2

    # A group deleted by hand is back with the gang's next generation.
    job_driver.raw.request("DELETE", cosched)
    job_driver.fail_pod(namespace, "cosched-worker-0", exit_code=137)
    job_driver.wait_running_pods(namespace, "cosched", 2, restart=1)
    assert job_driver.raw.request("GET", cosched)["spec"]["minMember"] == 2


@pytest.fixture
def private_node(cluster) -> Any:
    """A KWOK node of this test's own, tainted so only its pods land there."""
    name = f"tf-lost-{uuid.uuid4().hex[:6]}"
    node = fake_node(name, {"key": "torchfleet.dev/private", "value": name, "effect": "NoSchedule"})
    cluster.kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def test_node_not_ready_loses_its_pods_and_restarts_the_gang(
    shared_operator, job_driver, cluster, namespace, private_node
):
    template = {
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": private_node},
            "tolerations": [{"key": "torchfleet.dev/private", "operator": "Exists"}],
        }
    }
    job_driver.create(namespace, "llm", spec(workers=1, template=template))
    job_driver.wait_running_pods(namespace, "llm", 2)
    job_driver.wait_phase(namespace, "llm", "Running")
    cluster.kubectl("label", "node", private_node, "torchfleet.dev/kwok-not-ready=true")
    restarting = job_driver.wait_for(
        "a gang restart for the lost node",
        lambda: (s := job_driver.status(namespace, "llm")).get("restartCount", 0) >= 1 and s,
        timeout=60,
    )
    reason = find(restarting["conditions"], "Restarting")["reason"]
    assert reason in ("NodeLost", "PodDeleted", "DeletionByTaintManager", "Evicted")
    cluster.kubectl("label", "node", private_node, "torchfleet.dev/kwok-not-ready-")
    job_driver.wait_running_pods(
        namespace, "llm", 2, restart=restarting["restartCount"], timeout=90
    )
    job_driver.wait_phase(namespace, "llm", "Running", timeout=60)


def test_operator_metrics_and_liveness_endpoints(shared_operator):
    text = shared_operator.metrics()
    for name in (
        "torchfleet_operator_reconcile_duration_seconds_bucket",
        "torchfleet_operator_pods_created_total",
        "process_resident_memory_bytes",
    ):
        assert name in text
    with urllib.request.urlopen(
        f"http://127.0.0.1:{shared_operator.health_port}/healthz", timeout=5
    ) as response:
        assert response.status == 200


def test_a_job_held_by_a_finalizer_keeps_its_status_while_it_is_deleted(
    shared_operator, job_driver, namespace
):
    """Someone's finalizer holds a deleted job (a CI system's, a GitOps tool's):
    it is still read until it goes, and the operator's passes over it write
    nothing (they once wrote its status away)."""
    body = job_driver.body("held", spec(workers=1))
    body["metadata"]["finalizers"] = ["example.com/hold"]
    job_driver.raw.request("POST", job_driver.job_path(namespace), body)
    job_driver.wait_running_pods(namespace, "held", 2)
    running = job_driver.wait_for(
        "the running job's status",
        lambda: (s := job_driver.status(namespace, "held")).get("phase") == "Running" and s,
    )
    passes = shared_operator.passes((namespace, "held"))
    job_driver.raw.request("DELETE", job_driver.job_path(namespace, "held"))
    shared_operator.wait_idle_after(passes, (namespace, "held"))
    kept = job_driver.status(namespace, "held")
    assert kept.get("phase") == "Running" and kept.get("startTime") == running["startTime"], kept
    job_driver.raw.request(
        "PATCH",
        job_driver.job_path(namespace, "held"),
        [{"op": "remove", "path": "/metadata/finalizers"}],
        content_type="application/json-patch+json",
    )
