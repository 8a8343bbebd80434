"""Gang scheduling against the real gang schedulers: all pods of a gang or none.

scheduler-plugins' Coscheduling and Volcano run beside the local control plane
(fixture ``gang_schedulers``); every test gets 4 KWOK nodes x 8 GPUs of its
own (``gang_pool``), so a 3-node gang of 8-GPU pods fits once, two do not.
Nothing here waits a fixed time to show that nothing happened: a test first
waits until the scheduler has refused the gang (its reason is in the job's
GangScheduled condition, its PodScheduled=False on the pods), then looks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.fixtures.gang import BLOCK_LABEL, GPU, SCHEDULER_NAME, GangPool, NativeGang, need
from torchfleet_operator.status.conditions import find

GANG_KINDS = ["Coscheduling", "Volcano"]
# kube-scheduler's own gang scheduling (1.37 beta, scheduling.k8s.io/v1beta1,
# feature gate GenericWorkload; 1.36 alpha, v1alpha2: the local cluster turns
# them on). Its version is the release's (fixture native_gang).
NATIVE = "Kubernetes"
WITH_NATIVE = [*GANG_KINDS, NATIVE]
SCHEDULER = {**SCHEDULER_NAME, NATIVE: "default-scheduler"}
PODGROUP_PATH = {
    "Coscheduling": "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    "Volcano": "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups/{name}",
    # One group per gang generation: {name} is the job's and its restart count.
    NATIVE: "/apis/{api}/namespaces/{ns}/podgroups/{name}-gen-0",
}


@pytest.fixture(autouse=True)
def release_gangs(cluster: Any, namespace: str) -> Iterator[None]:
    """Deletes the test's PodGroups at once after it: the namespace goes
    without waiting, and until then Volcano counts an admitted (Inqueue)
    group's minResources as taken, holding the next test's gang back."""
    yield
    for plural in ("podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io"):
        cluster.kubectl("delete", plural, "--all", "-n", namespace, check=False)


def gang_spec(
    pool: GangPool, kind: str, nodes: int = 3, gpus: int = 8, **scheduling: Any
) -> dict[str, Any]:
    """A job of ``nodes`` pods x ``gpus`` GPUs on the pool, gang-scheduled by ``kind``."""
    chosen: dict[str, Any] = {"podGroup": kind, **scheduling}
    if kind == "Coscheduling":
        # Installed as a second scheduler, scheduler-plugins goes by its own name.
        chosen.setdefault("schedulerName", SCHEDULER_NAME[kind])
    if kind == "None":
        chosen = {}
    return {
        "command": ["python", "train.py"],
        "resources": {"gpus": gpus},
        "master": {"template": pool.template},
        "worker": {"replicas": nodes - 1, "template": pool.template},
        "scheduling": chosen,
    }


def bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def refused(pod: dict[str, Any]) -> bool:
    """The scheduler looked at the pod and could not place it."""
    scheduled = find((pod.get("status") or {}).get("conditions"), "PodScheduled")
    return scheduled is not None and scheduled["status"] == "False"


def gang_condition(job_driver: Any, namespace: str, name: str) -> dict[str, Any] | None:
    return find(job_driver.status(namespace, name).get("conditions"), "GangScheduled")


def wait_gang_refused(
    job_driver: Any, namespace: str, name: str, nodes: int = 3, timeout: float = 90
) -> dict[str, Any]:
    """Waits until the gang scheduler has refused the whole gang and the job
    says so; returns the job's GangScheduled condition."""

    def refused_and_said() -> dict[str, Any] | None:
        pods = job_driver.pods(namespace, name)
        condition = gang_condition(job_driver, namespace, name)
        if len(pods) < nodes or not any(refused(p) for p in pods):
            return None
        if not condition or condition["status"] != "False":
            return None
        return condition

    return dict(
        job_driver.wait_for(f"the gang scheduler refusing {name}", refused_and_said, timeout)
    )


def wait_gang_placed(
    job_driver: Any, namespace: str, name: str, nodes: int = 3, restart: int = 0
) -> list[dict[str, Any]]:
    pods = job_driver.wait_running_pods(namespace, name, nodes, restart=restart, timeout=90)
    job_driver.wait_for(
        f"{name} GangScheduled",
        lambda: (c := gang_condition(job_driver, namespace, name)) and c["status"] == "True",
    )
    return pods


def group_path(kind: str, namespace: str, name: str, native: NativeGang) -> str:
    return PODGROUP_PATH[kind].format(ns=namespace, name=name, api=native.api)


def native_refusal_mirrored(
    job_driver: Any, namespace: str, name: str, native: NativeGang
) -> dict[str, Any] | None:
    """kube-scheduler's PodGroup(Initially)Scheduled=False, once the job's
    GangScheduled condition carries its reason and words."""
    group = job_driver.raw.request("GET", group_path(NATIVE, namespace, name, native))
    said = find((group.get("status") or {}).get("conditions"), native.scheduled_condition)
    condition = gang_condition(job_driver, namespace, name)
    if not said or said["status"] != "False" or not condition:
        return None
    mirrored = condition["reason"] == f"PodGroup{said['reason']}"
    return said if mirrored and said["message"] in condition["message"] else None


def need_scheduler(gang_schedulers: set[str], kind: str) -> None:
    """kube-scheduler's own gang scheduling runs wherever the cluster runs."""
    if kind != NATIVE:
        need(gang_schedulers, kind)


def start_blockers(cluster: Any, job_driver: Any, pool: GangPool, namespace: str, count: int):
    names = [f"blocker-{i}" for i in range(count)]
    for name in names:
        job_driver.raw.request("POST", f"/api/v1/namespaces/{namespace}/pods", pool.blocker(name))
    job_driver.wait_for(
        f"{count} blockers running",
        lambda: all(
            ((job_driver.get_core(namespace, "pods", n) or {}).get("status") or {}).get("phase")
            == "Running"
            for n in names
        ),
    )
    return names


def scheduled_by(job_driver: Any, namespace: str, pod: dict[str, Any]) -> set[str]:
    """Who reported binding ``pod`` (its Scheduled events' reporting component).

    A scheduler posts the event after the binding, through its own broadcaster,
    so it can land after the pod is seen bound: waited for. Only this pod's
    (by uid): an earlier pod of the same name has events of its own."""
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]

    def reporters() -> set[str]:
        return {
            e.get("reportingComponent") or (e.get("source") or {}).get("component", "")
            for e in job_driver.events(namespace, name)
            if e["reason"] == "Scheduled" and (e.get("involvedObject") or {}).get("uid") == uid
        }

    return set(job_driver.wait_for(f"a Scheduled event for {name} ({uid})", reporters, 30))


# ---- 1. all or nothing ------------------------------------------------------


@pytest.mark.parametrize("kind", WITH_NATIVE)
def test_gang_binds_no_pod_until_all_fit_then_all_together(
    kind, gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool, native_gang
):
    need_scheduler(gang_schedulers, kind)
    blockers = start_blockers(cluster, job_driver, gang_pool, namespace, 2)
    job_driver.create(namespace, "gang", gang_spec(gang_pool, kind))

    condition = wait_gang_refused(job_driver, namespace, "gang")
    assert bound(job_driver.pods(namespace, "gang")) == []  # none holds a GPU
    assert "0 of 3 pods placed" in condition["message"], condition
    assert kind in condition["message"], condition
    group = job_driver.raw.request("GET", group_path(kind, namespace, "gang", native_gang))
    if kind == NATIVE:
        # No minResources: kube-scheduler tries the whole gang on the nodes at
        # once, and says why it refused in the group's condition.
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
        said = job_driver.wait_for(
            "the group's refusal in the job's condition",
            lambda: native_refusal_mirrored(job_driver, namespace, "gang", native_gang),
        )
        assert said["reason"] == "Unschedulable", said
    else:
        assert group["spec"]["minMember"] == 3
        assert group["spec"]["minResources"][GPU] == "24"
        assert group.get("status", {}).get("phase") not in ("Running", "Scheduled")

    for blocker in blockers:
        job_driver.succeed_pod(namespace, blocker)
    pods = wait_gang_placed(job_driver, namespace, "gang")
    assert len({p["spec"]["nodeName"] for p in pods}) == 3
    for pod in pods:
        assert scheduled_by(job_driver, namespace, pod) == {SCHEDULER[kind]}


# ---- 2. no deadlock between two gangs ---------------------------------------------


def test_default_scheduler_lets_two_gangs_each_hold_part(
    shared_operator, job_driver, cluster, namespace, gang_pool
):
    """The contrast: without a gang scheduler, pods are placed one by one, so
    two 3-node gangs on 4 nodes leave at least one gang partly placed, its
    GPUs held by pods that cannot start training (both partly placed is the
    deadlock). Bounded: it looks once the scheduler has refused the 2 pods
    that do not fit."""
    for name in ("a", "b"):
        job_driver.create(namespace, name, gang_spec(gang_pool, "None"))

    def settled() -> dict[str, int] | None:
        pods = job_driver.pods(namespace)
        if len(pods) < 6 or len(bound(pods)) < 4 or sum(map(refused, pods)) < 2:
            return None
        return {n: len(bound(job_driver.pods(namespace, n))) for n in ("a", "b")}

    placed = job_driver.wait_for("4 pods bound and 2 refused", settled, timeout=90)
    assert sorted(placed.values()) in ([1, 3], [2, 2]), placed
    assert any(0 < count < 3 for count in placed.values())  # GPUs held by a broken gang


@pytest.mark.parametrize("kind", WITH_NATIVE)
def test_gang_scheduler_runs_one_gang_whole_and_holds_the_other_back(
    kind, gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool
):
    need_scheduler(gang_schedulers, kind)
    for name in ("a", "b"):
        job_driver.create(namespace, name, gang_spec(gang_pool, kind))

    def one_placed_one_refused() -> tuple[str, str] | None:
        states = {n: gang_condition(job_driver, namespace, n) for n in ("a", "b")}
        placed = [n for n, c in states.items() if c and c["status"] == "True"]
        waiting = [
            n
            for n, c in states.items()
            if c and c["status"] == "False" and any(map(refused, job_driver.pods(namespace, n)))
        ]
        return (placed[0], waiting[0]) if placed and waiting else None

    first, second = job_driver.wait_for(
        "one gang placed, the other refused", one_placed_one_refused, timeout=120
    )
    assert len(bound(job_driver.pods(namespace, first))) == 3
    assert bound(job_driver.pods(namespace, second)) == []

    # The master's success ends the job, and the operator then removes its
    # workers (succeeding them one by one raced that: a 404 on the last one).
    job_driver.succeed_pod(namespace, f"{first}-master-0")
    job_driver.wait_phase(namespace, first, "Succeeded")
    wait_gang_placed(job_driver, namespace, second)


# ---- 3. a gang restart goes through the gang scheduler again ---------------------


@pytest.mark.parametrize("kind", WITH_NATIVE)
def test_gang_restart_is_scheduled_as_a_whole_again(
    kind, gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool, native_gang
):
    need_scheduler(gang_schedulers, kind)
    job_driver.create(namespace, "gang", gang_spec(gang_pool, kind))
    wait_gang_placed(job_driver, namespace, "gang")
    # The 4th node is taken while the gang restarts, so the next gang fits only
    # where the old one ran: it must wait for all of the old pods to be gone.
    start_blockers(cluster, job_driver, gang_pool, namespace, 1)
    job_driver.fail_pod(namespace, "gang-worker-0", exit_code=1)

    pods = wait_gang_placed(job_driver, namespace, "gang", restart=1)
    assert job_driver.status(namespace, "gang")["restartCount"] == 1
    for pod in pods:
        assert pod["spec"]["schedulerName"] == SCHEDULER[kind]
        reporters = scheduled_by(job_driver, namespace, pod)
        assert reporters == {SCHEDULER[kind]}, reporters
    if kind == NATIVE:  # the new generation's own group placed it
        assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"gang-gen-1"}
        path = group_path(kind, namespace, "gang", native_gang).replace("gen-0", "gen-1")
        group = job_driver.raw.request("GET", path)
        said = find(group["status"]["conditions"], native_gang.scheduled_condition)
        assert said["status"] == "True", group["status"]


def native_group_gone(job_driver: Any, path: str) -> bool:
    """The PodGroup at ``path`` is gone (its protection finalizer released)."""
    try:
        job_driver.raw.request("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_native_groups_have_the_jobs_priority_and_go_with_their_generation(
    shared_operator, job_driver, cluster, namespace, gang_pool, native_gang
):
    """Kubernetes' own: each generation's PodGroup carries the job's priority
    class (1.37: the API server's Priority admission resolves its value), and
    is deleted once its generation is over: after a gang restart, the old
    one; after the job finished, the last one. The job's Workload stays."""
    high = f"gang-high-{namespace[-6:]}"
    priority_class = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": high},
        "value": 1000,
    }
    job_driver.raw.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", priority_class)
    try:
        job = gang_spec(gang_pool, NATIVE, priorityClassName=high)
        job_driver.create(namespace, "gang", job)
        wait_gang_placed(job_driver, namespace, "gang")
        first = group_path(NATIVE, namespace, "gang", native_gang)
        group = job_driver.raw.request("GET", first)
        if native_gang.api.endswith("/v1beta1"):
            assert (group["spec"]["priorityClassName"], group["spec"]["priority"]) == (high, 1000)
        else:  # 1.36: the field needs the alpha gate WorkloadAwarePreemption
            assert "priorityClassName" not in group["spec"], group["spec"]

        job_driver.fail_pod(namespace, "gang-worker-0", exit_code=1)
        wait_gang_placed(job_driver, namespace, "gang", restart=1)
        job_driver.wait_for("gang-gen-0 deleted", lambda: native_group_gone(job_driver, first))
        second = first.replace("gen-0", "gen-1")
        assert job_driver.raw.request("GET", second)["metadata"].get("deletionTimestamp") is None

        job_driver.succeed_pod(namespace, "gang-master-0")
        job_driver.wait_phase(namespace, "gang", "Succeeded")
        job_driver.wait_for("gang-gen-1 deleted", lambda: native_group_gone(job_driver, second))
        workload = f"/apis/{native_gang.api}/namespaces/{namespace}/workloads/gang"
        assert job_driver.raw.request("GET", workload)["metadata"]["name"] == "gang"
    finally:
        job_driver.raw.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{high}")


# ---- 3b. an elastic gang: minMember is minNodes -----------------------------------


@pytest.mark.parametrize("kind", WITH_NATIVE)
def test_an_elastic_gang_starts_on_min_nodes_and_the_rest_join_when_room_appears(
    kind, gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool, native_gang
):
    need_scheduler(gang_schedulers, kind)
    blockers = start_blockers(cluster, job_driver, gang_pool, namespace, 2)
    job = gang_spec(gang_pool, kind, nodes=4)
    job["elastic"] = {"minNodes": 2, "maxNodes": 4}
    job_driver.create(namespace, "elastic", job)

    # Room for two: the gang scheduler places two pods (the group's minimum)
    # and leaves the other two waiting, where a fixed gang of 4 would get none.
    def two_placed_two_refused() -> list[dict[str, Any]] | None:
        pods = job_driver.pods(namespace, "elastic")
        placed = bound(pods)
        waiting = [p for p in pods if refused(p)]
        return placed if len(placed) == 2 and len(waiting) == 2 else None

    placed = job_driver.wait_for("two pods placed, two refused", two_placed_two_refused, 90)
    group = job_driver.raw.request("GET", group_path(kind, namespace, "elastic", native_gang))
    if kind == NATIVE:
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    else:
        assert group["spec"]["minMember"] == 2
        assert group["spec"]["minResources"][GPU] == "16"
    for pod in placed:
        assert scheduled_by(job_driver, namespace, pod) == {SCHEDULER[kind]}

    for blocker in blockers:
        job_driver.succeed_pod(namespace, blocker)
    pods = job_driver.wait_running_pods(namespace, "elastic", 4, timeout=90)
    grown = job_driver.wait_running_on(namespace, "elastic", "4/4")
    assert grown["elastic"]["currentNodes"] == 4
    # The same gang grew: the first two pods kept running, nothing was replaced.
    assert {p["metadata"]["uid"] for p in placed} <= {p["metadata"]["uid"] for p in pods}
    assert grown.get("restartCount", 0) == 0 and grown["elastic"]["replacements"] == 0


# ---- 4. Volcano's queue capacity ------------------------------------------------


def test_volcano_queue_capacity_holds_a_gang_back_with_volcanos_reason(
    gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool
):
    need(gang_schedulers, "Volcano")
    queue = f"q-{namespace[-6:]}"
    queue_path = f"/apis/scheduling.volcano.sh/v1beta1/queues/{queue}"
    job_driver.raw.request(
        "POST",
        "/apis/scheduling.volcano.sh/v1beta1/queues",
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"weight": 1, "reclaimable": False, "capability": {GPU: "16"}},
        },
    )
    try:
        job_driver.create(namespace, "big", gang_spec(gang_pool, "Volcano", queueName=queue))
        wait_gang_refused(job_driver, namespace, "big")
        # The operator may first say the gang waits, before it has read the phase
        # Volcano gives the PodGroup: the reason this test is about comes next.
        condition = job_driver.wait_for(
            "the job to give Volcano's PodGroupPending",
            lambda: (
                (found := gang_condition(job_driver, namespace, "big"))
                and found["reason"] == "PodGroupPending"
                and found
            ),
            60,
        )
        assert f"not admitted from queue {queue}" in condition["message"], condition
        assert "tasks in gang unschedulable" in condition["message"], condition  # Volcano's
        assert bound(job_driver.pods(namespace, "big")) == []

        # Room in the queue for the whole gang: it runs.
        job_driver.raw.request(
            "PATCH",
            queue_path,
            {"spec": {"capability": {GPU: "24"}}},
            content_type="application/merge-patch+json",
        )
        wait_gang_placed(job_driver, namespace, "big")
    finally:
        job_driver.raw.request("DELETE", queue_path)


# ---- topology Required with a gang scheduler ---------------------------------------


@pytest.mark.parametrize("kind", GANG_KINDS)
def test_required_topology_places_the_whole_gang_in_one_block_or_none(
    kind, gang_schedulers, shared_operator, job_driver, cluster, namespace, gang_pool
):
    need(gang_schedulers, kind)
    topology = {"topology": {"key": BLOCK_LABEL, "mode": "Required"}}
    # Blocks hold 2 nodes each: a 3-node gang fits in none, and no pod of it
    # may hold GPUs while it waits.
    job_driver.create(namespace, "wide", gang_spec(gang_pool, kind, **topology))
    wait_gang_refused(job_driver, namespace, "wide")
    assert bound(job_driver.pods(namespace, "wide")) == []

    job_driver.create(namespace, "narrow", gang_spec(gang_pool, kind, nodes=2, **topology))
    pods = wait_gang_placed(job_driver, namespace, "narrow", nodes=2)
    blocks = {
        job_driver.raw.request("GET", f"/api/v1/nodes/{p['spec']['nodeName']}")["metadata"][
            "labels"
        ][BLOCK_LABEL]
        for p in pods
    }
    assert len(blocks) == 1
    assert bound(job_driver.pods(namespace, "wide")) == []
