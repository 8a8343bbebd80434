"""The operator as TrainingJob's Kueue integration, against a real Kueue (v0.17.0,
or v0.10.6 in make test-kueue-oldest; dev/cluster/kueue.py) and KWOK's fake
8-GPU nodes: quota, flavors, preemption, a queue that does not exist, a
WorkloadPriorityClass, a runtime's queue and priority, suspend, a job changed
while it waits.

Each test has its own namespace, LocalQueue and (cluster-scoped, uniquely
named) ClusterQueue, ResourceFlavors and PriorityClasses.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_runtimes import Runtimes, job_on, runtime_spec
from tests.fixtures.kueue import (
    create_labelled,
    job_condition,
    job_workload,
    wait_condition,
    wait_short_of_quota,
    workloads,
)
from tests.fixtures.operator import kwok_job_spec
from torchfleet_operator.api.constants import CLUSTER_RUNTIME_KIND
from torchfleet_operator.status.conditions import is_true

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"
WPC_LABEL = "kueue.x-k8s.io/priority-class"


def gpu_job(queue: str, priority_class: str | None = None, gpus: int = 8) -> dict[str, Any]:
    """1+0: one master pod with ``gpus`` GPUs, queued in ``queue``."""
    scheduling: dict[str, Any] = {"queueName": queue}
    if priority_class:
        scheduling["priorityClassName"] = priority_class
    return kwok_job_spec(workers=0, resources={"gpus": gpus}, scheduling=scheduling)


def test_quota_admits_two_of_three_and_the_third_runs_when_the_first_finishes(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("gpus16", [(flavor, {GPU: 16})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    for name in ("first", "second", "third"):
        job_driver.create(namespace, name, gpu_job(queue))
        # Created in order, so Kueue (StrictFIFO by creation time) admits first and second.
        job_driver.wait_for(
            f"the Workload of {name}",
            lambda n=name: any(
                w["metadata"]["labels"].get("torchfleet.dev/job-name") == n
                for w in workloads(job_driver, namespace)
            ),
        )
    # The operator created them in the version this Kueue prefers (discovered at
    # start): the apiserver records the version each writer of the spec used.
    written_in = {
        entry["apiVersion"]
        for w in workloads(job_driver, namespace)
        for entry in w["metadata"]["managedFields"]
        if entry.get("subresource") != "status"
    }
    assert written_in == {kueue}
    for name in ("first", "second"):
        job_driver.wait_running_pods(namespace, name, 1)
        job_driver.wait_phase(namespace, name, "Running")
        admitted = job_condition(job_driver, namespace, name, "Admitted")
        assert admitted and admitted["status"] == "True"

    waiting = wait_condition(
        job_driver,
        namespace,
        "third",
        "QuotaReserved",
        lambda c: c["status"] == "False" and "insufficient" in c.get("message", ""),
    )
    # Kueue's own words, e.g. "couldn't assign flavors to pod set master:
    # insufficient unused quota for nvidia.com/gpu in flavor default-..., 8 more needed".
    assert GPU in waiting["message"], waiting
    assert job_driver.status(namespace, "third")["phase"] == "Pending"
    assert job_driver.pods(namespace, "third") == []
    (workload,) = [
        w
        for w in workloads(job_driver, namespace)
        if w["metadata"]["labels"]["torchfleet.dev/job-name"] == "third"
    ]
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingJob", "third", True)
    (master_set,) = workload["spec"]["podSets"]
    assert master_set["name"] == "master" and master_set["count"] == 1
    requests = master_set["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests[GPU] == "8"

    job_driver.succeed_pod(namespace, "first-master-0")
    job_driver.wait_phase(namespace, "first", "Succeeded")
    job_driver.wait_for(
        "the first job's Workload Finished",
        lambda: any(
            is_true(w["status"].get("conditions"), "Finished")
            for w in workloads(job_driver, namespace)
            if w["metadata"]["labels"]["torchfleet.dev/job-name"] == "first"
        ),
    )
    job_driver.wait_running_pods(namespace, "third", 1, timeout=90)
    job_driver.wait_phase(namespace, "third", "Running")
    assert job_condition(job_driver, namespace, "third", "QuotaReserved")["status"] == "True"


def test_an_elastic_job_kueue_admits_partially_runs_on_the_pods_it_was_given(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    flavor = kueue_objects.flavor("default")
    # Room for three pods of 8 GPUs; the job asks for four and can run on two.
    cq = kueue_objects.cluster_queue("gpus24", [(flavor, {GPU: 24})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    elastic = {"minNodes": 2, "maxNodes": 4, "maxRestarts": 3}
    job = kwok_job_spec(
        workers=3, resources={"gpus": 8}, scheduling={"queueName": queue}, elastic=elastic
    )
    job_driver.create(namespace, "llm", job)

    job_driver.wait_running_pods(namespace, "llm", 3, timeout=90)
    running = job_driver.wait_running_on(namespace, "llm", "3/4")
    assert running["elastic"]["currentNodes"] == 3
    assert running["elastic"]["desiredNodes"] == 4 and running["elastic"]["replacements"] == 0
    assert (
        "Kueue admitted 3 of the 4 pods"
        in job_condition(job_driver, namespace, "llm", "Running")["message"]
    )
    # Kueue itself shrank the worker PodSet within its minCount ...
    (workload,) = workloads(job_driver, namespace)
    (_, workers) = workload["spec"]["podSets"]
    assert (workers["count"], workers["minCount"]) == (3, 1)
    counts = {a["name"]: a["count"] for a in workload["status"]["admission"]["podSetAssignments"]}
    assert counts == {"master": 1, "worker": 2}
    # ... and the worker it did not admit was never created, nor counted as lost.
    assert sorted(p["metadata"]["name"] for p in job_driver.pods(namespace, "llm")) == [
        "llm-master-0",
        "llm-worker-0",
        "llm-worker-1",
    ]
    assert job_driver.status(namespace, "llm").get("restartCount", 0) == 0


def test_admitted_flavor_puts_its_node_labels_on_the_pods(
    kueue, shared_operator, job_driver, kueue_objects, cluster, namespace
):
    pool_label = "torchfleet.dev/test-pool"
    pool_a, pool_b = kueue_objects.name("pool-a"), kueue_objects.name("pool-b")
    nodes = {pool_a: "gpu-node-0", pool_b: "gpu-node-1"}
    for pool, node in nodes.items():
        cluster.kubectl("label", "node", node, f"{pool_label}={pool}", "--overwrite")
    try:
        # pool-a has no GPUs to give: Kueue assigns pool-b, and the pods must go there.
        flavor_a = kueue_objects.flavor("pool-a", {pool_label: pool_a})
        flavor_b = kueue_objects.flavor("pool-b", {pool_label: pool_b})
        cq = kueue_objects.cluster_queue("pools", [(flavor_a, {GPU: 0}), (flavor_b, {GPU: 16})])
        queue = kueue_objects.local_queue(namespace, "team-a", cq)
        # 1+1 pods of 4 GPUs: both fit on pool-b's one 8-GPU node.
        spec = kwok_job_spec(workers=1, resources={"gpus": 4}, scheduling={"queueName": queue})
        job_driver.create(namespace, "placed", spec)
        pods = job_driver.wait_running_pods(namespace, "placed", 2)
        for pod in pods:
            assert pod["spec"]["nodeSelector"][pool_label] == pool_b
            assert pod["spec"]["nodeName"] == nodes[pool_b]
        (workload,) = workloads(job_driver, namespace)
        assignments = workload["status"]["admission"]["podSetAssignments"]
        assert {a["name"]: a["flavors"][GPU] for a in assignments} == {
            "master": flavor_b,
            "worker": flavor_b,
        }
    finally:
        for node in nodes.values():
            cluster.kubectl("label", "node", node, f"{pool_label}-", check=False)


def test_preempted_job_stops_waits_and_resumes_without_counting_a_restart(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    low = kueue_objects.priority_class("low", 100)
    high = kueue_objects.priority_class("high", 1000)
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue(
        "one-job",
        [(flavor, {GPU: 8})],
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    job_driver.create(namespace, "low", gpu_job(queue, low))
    (low_pod,) = job_driver.wait_running_pods(namespace, "low", 1)
    job_driver.wait_phase(namespace, "low", "Running")

    job_driver.create(namespace, "high", gpu_job(queue, high))
    evicted = wait_condition(
        job_driver, namespace, "low", "Evicted", lambda c: c["status"] == "True"
    )
    assert evicted["reason"] == "Preempted", evicted
    assert "evicted by Kueue" in evicted["message"]
    job_driver.wait_running_pods(namespace, "high", 1, timeout=90)
    job_driver.wait_phase(namespace, "high", "Running")
    assert job_driver.get_core(namespace, "pods", low_pod["metadata"]["name"]) is None
    status = job_driver.status(namespace, "low")
    assert status["phase"] == "Pending"
    assert status["disruptions"] == 1 and status["restartCount"] == 0
    assert job_condition(job_driver, namespace, "low", "QuotaReserved")["status"] == "False"

    job_driver.succeed_pod(namespace, "high-master-0")
    job_driver.wait_phase(namespace, "high", "Succeeded")
    (again,) = job_driver.wait_running_pods(namespace, "low", 1, timeout=90)
    assert again["metadata"]["uid"] != low_pod["metadata"]["uid"]
    status = job_driver.wait_phase(namespace, "low", "Running")
    assert status["restartCount"] == 0 and status["disruptions"] == 1
    assert job_condition(job_driver, namespace, "low", "Evicted")["status"] == "False"


def test_a_queue_that_does_not_exist_is_reported_in_kueues_words(
    kueue, shared_operator, job_driver, namespace
):
    job_driver.create(namespace, "lost", gpu_job("no-such-queue"))
    reserved = wait_condition(
        job_driver,
        namespace,
        "lost",
        "QuotaReserved",
        lambda c: "no-such-queue" in c.get("message", ""),
    )
    assert reserved["status"] == "False"
    assert "doesn't exist" in reserved["message"], reserved
    assert job_driver.pods(namespace, "lost") == []

    # No hot loop: a pass forced by a label change writes nothing more.
    passes = shared_operator.metric("torchfleet_operator_reconcile_duration_seconds_count")
    job_driver.patch(namespace, "lost", {"metadata": {"labels": {"touched": "yes"}}})
    job_driver.wait_for(
        "the pass the label change triggers",
        lambda: (
            shared_operator.metric("torchfleet_operator_reconcile_duration_seconds_count") > passes
        ),
    )
    touched = job_driver.get(namespace, "lost")
    assert touched["metadata"]["labels"]["touched"] == "yes"
    job_driver.patch(namespace, "lost", {"metadata": {"labels": {"touched": "twice"}}})
    after = shared_operator.metric("torchfleet_operator_reconcile_duration_seconds_count")
    job_driver.wait_for(
        "the second pass",
        lambda: (
            shared_operator.metric("torchfleet_operator_reconcile_duration_seconds_count") > after
        ),
    )
    assert job_driver.status(namespace, "lost") == touched["status"]
    assert shared_operator.metric("torchfleet_operator_reconcile_errors_total") == 0
    assert shared_operator.process.poll() is None


# ---- the Workload while the job waits: priority class, suspend, a changed job --------


def test_a_workload_priority_class_orders_two_queued_jobs(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    low = kueue_objects.workload_priority_class("low", 100)
    high = kueue_objects.workload_priority_class("high", 1000)
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("one-job", [(flavor, {GPU: 8})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    job_driver.create(namespace, "first", gpu_job(queue))
    job_driver.wait_running_pods(namespace, "first", 1)
    # Queued behind it: low first, then high.
    for name, priority_class in (("low", low), ("high", high)):
        create_labelled(job_driver, namespace, name, gpu_job(queue), {WPC_LABEL: priority_class})
        workload = job_driver.wait_for(
            f"the Workload of {name}", lambda n=name: job_workload(job_driver, namespace, n)
        )
    assert workload["spec"]["priority"] == 1000
    if kueue.endswith("v1beta2"):
        assert workload["spec"]["priorityClassRef"] == {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": high,
        }
    else:
        assert workload["spec"]["priorityClassName"] == high
        assert workload["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"

    for name in ("low", "high"):  # both in the queue, tried and waiting
        wait_short_of_quota(job_driver, namespace, name)
    job_driver.succeed_pod(namespace, "first-master-0")
    # The higher class goes first although it came later.
    job_driver.wait_running_pods(namespace, "high", 1, timeout=90)
    job_driver.wait_phase(namespace, "high", "Running")
    assert job_driver.pods(namespace, "low") == []
    assert job_condition(job_driver, namespace, "low", "QuotaReserved")["status"] == "False"


def test_a_runtimes_priority_class_and_queue_reach_the_workload(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    """A platform team's runtime sets the queue and the PriorityClass; a job
    naming it sets neither, and its Workload has both, as if the job had."""
    high = kueue_objects.priority_class("high", 1000)
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("runtime", [(flavor, {GPU: 8})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    made = Runtimes(job_driver)
    name = f"queued-{namespace}"
    made.create(
        CLUSTER_RUNTIME_KIND,
        name,
        {
            **runtime_spec("busybox:1"),
            "resources": {"gpus": 8},
            "scheduling": {"queueName": queue, "priorityClassName": high},
        },
    )
    try:
        job_driver.create(
            namespace, "ranked", job_on(CLUSTER_RUNTIME_KIND, name, worker={"replicas": 0})
        )
        workload = job_driver.wait_for(
            "the job's Workload", lambda: job_workload(job_driver, namespace, "ranked")
        )
        assert workload["spec"]["queueName"] == queue
        assert workload["spec"]["priority"] == 1000, workload["spec"]
        job_driver.wait_running_pods(namespace, "ranked", 1, timeout=90)
    finally:
        made.delete(CLUSTER_RUNTIME_KIND, name)


def test_a_suspended_job_is_inactive_and_suspended_when_admitted_hands_its_quota_back(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("one-job", [(flavor, {GPU: 8})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    job_driver.create(namespace, "first", gpu_job(queue))
    job_driver.wait_running_pods(namespace, "first", 1)
    # "held" is queued suspended: its Workload is made inactive.
    job_driver.create(namespace, "held", {**gpu_job(queue), "suspend": True})
    held = job_driver.wait_for(
        "held's Workload", lambda: job_workload(job_driver, namespace, "held")
    )
    assert held["spec"]["active"] is False

    job_driver.patch(namespace, "held", {"spec": {"suspend": False}})
    # Back in the queue: Kueue tries it (never before: it was made inactive).
    wait_short_of_quota(job_driver, namespace, "held")
    assert job_workload(job_driver, namespace, "held")["spec"].get("active") is not False
    job_driver.succeed_pod(namespace, "first-master-0")
    # The same Workload is admitted once the quota is free. (Whether it keeps
    # its place ahead of a later job is Kueue's queue ordering, which may date a
    # reactivated Workload from its reactivation: not asserted.)
    job_driver.wait_running_pods(namespace, "held", 1, timeout=90)
    job_driver.wait_phase(namespace, "held", "Running")
    assert job_workload(job_driver, namespace, "held")["metadata"]["uid"] == held["metadata"]["uid"]
    job_driver.create(namespace, "next", gpu_job(queue))
    wait_short_of_quota(job_driver, namespace, "next")

    # Suspended while admitted: the gang stops and the quota goes to next.
    job_driver.patch(namespace, "held", {"spec": {"suspend": True}})
    job_driver.wait_running_pods(namespace, "next", 1, timeout=90)
    job_driver.wait_phase(namespace, "next", "Running")
    assert job_driver.wait_phase(namespace, "held", "Suspended")
    job_driver.wait_for("held's pods gone", lambda: not job_driver.pods(namespace, "held"))
    workload = job_workload(job_driver, namespace, "held")
    assert workload["spec"]["active"] is False
    assert not (workload.get("status") or {}).get("admission")


def test_a_job_changed_while_it_waits_gets_a_new_workload(
    kueue, shared_operator, job_driver, kueue_objects, namespace
):
    flavor = kueue_objects.flavor("default")
    cq = kueue_objects.cluster_queue("gpus16", [(flavor, {GPU: 16})])
    queue = kueue_objects.local_queue(namespace, "team-a", cq)
    # 3 pods x 8 GPUs never fit in 16 ...
    spec = kwok_job_spec(2, resources={"gpus": 8}, scheduling={"queueName": queue})
    job_driver.create(namespace, "big", spec)
    wait_short_of_quota(job_driver, namespace, "big")
    before = job_workload(job_driver, namespace, "big")
    # ... 3 x 4 do. The pods' shape changes only while the job is suspended:
    # the waiting Workload is replaced by one that asks for 4 each.
    job_driver.patch(namespace, "big", {"spec": {"suspend": True}})
    job_driver.patch(namespace, "big", {"spec": {"suspend": False, "resources": {"gpus": 4}}})
    job_driver.wait_running_pods(namespace, "big", 3, timeout=90)
    after = job_workload(job_driver, namespace, "big")
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert [w["metadata"]["uid"] for w in workloads(job_driver, namespace)] == [
        after["metadata"]["uid"]
    ]
    requests = after["spec"]["podSets"][1]["template"]["spec"]["containers"][0]["resources"]
    assert requests["requests"][GPU] == "4"
    # Once admitted, a change of its PodSets (here a topology hint, which may
    # change while the job runs) is not carried into it: the same Workload stays.
    hint = {"key": "kubernetes.io/hostname", "mode": "Preferred"}
    job_driver.patch(namespace, "big", {"spec": {"scheduling": {"topology": hint}}})
    job_driver.wait_for(
        "the operator's pass over the change",
        lambda: job_driver.status(namespace, "big").get("observedGeneration", 0) >= 4,
    )
    assert job_workload(job_driver, namespace, "big")["metadata"]["uid"] == after["metadata"]["uid"]
    assert job_driver.status(namespace, "big")["phase"] == "Running"
