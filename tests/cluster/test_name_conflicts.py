"""Objects the operator did not create, against a real apiserver.

A child's name already held by someone else's object is a conflict, never a
success: the job does not mount another owner's volume or publish its master
behind another owner's Service. And pods are the job's by controller owner UID,
never by label alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.operator import ON_FAKE_NODES
from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.desired.labels import (
    JOB_NAME_LABEL,
    NODE_RANK_LABEL,
    RESTART_LABEL,
    ROLE_LABEL,
)
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster


def _service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": "someone-else"}},
        "spec": {"selector": {"app": "someone-else"}, "ports": [{"port": 80}]},
    }


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def _volume_for(cluster: Any, request: Any, namespace: str, claim: str) -> None:
    """A volume that only the job's own claim can bind (this cluster has no provisioner).

    ReadWriteMany only: the squatter asks for ReadWriteOnce, so it never binds
    the volume meant for the job's gang-shared claim of the same name.
    """
    name = f"{namespace}-{claim}"[:63]
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "hostPath": {"path": f"/tmp/{name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
    request.addfinalizer(lambda: cluster.kubectl("delete", "pv", name, "--wait=false", check=False))


def _conflict(job_driver: Any, namespace: str, job: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        condition = find(job_driver.status(namespace, job).get("conditions"), "ChildrenRejected")
        if condition is None or condition["reason"] != "NameConflict":
            return None
        return condition if condition["status"] == "True" else None

    return job_driver.wait_for(f"a NameConflict on {job}", found)


@pytest.mark.parametrize(
    "job, squatter, kind, extra",
    [
        pytest.param("clash", _service("clash"), "Service", {}, id="service"),
        pytest.param(
            "ckpt",
            _claim("ckpt-checkpoint"),
            "PersistentVolumeClaim",
            {"checkpoint": {"claimTemplate": {"size": "1Gi"}}},
            id="checkpoint-claim",
        ),
    ],
)
def test_a_name_held_by_someone_else_is_a_conflict_and_never_used(
    shared_operator, job_driver, cluster, namespace, job, squatter, kind, extra, request
):
    if kind == "PersistentVolumeClaim":
        _volume_for(cluster, request, namespace, squatter["metadata"]["name"])
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(squatter))
    job_driver.create(namespace, job, spec(workers=1, **extra))
    condition = _conflict(job_driver, namespace, job)
    name = squatter["metadata"]["name"]
    assert f'{kind} {name}: {kind} "{name}" already exists' in condition["message"], condition
    assert "not controlled by any object" in condition["message"]
    # No pod was created to use it, and the squatter is untouched.
    assert job_driver.pods(namespace, job) == []
    held = job_driver.get_core(namespace, _plural(kind), name)
    assert held is not None and not held["metadata"].get("ownerReferences")
    # Once the name is free, the job makes its own and runs.
    cluster.kubectl("delete", _plural(kind), name, "-n", namespace, "--wait=true")
    job_driver.wait_running_pods(namespace, job, 2)
    own = job_driver.get_core(namespace, _plural(kind), name)
    assert own is not None
    assert (
        own["metadata"]["ownerReferences"][0]["uid"]
        == job_driver.get(namespace, job)["metadata"]["uid"]
    )


def test_pods_with_the_jobs_labels_but_not_its_own_are_never_adopted(
    shared_operator, job_driver, cluster, namespace
):
    job_driver.create(namespace, "owned", spec(workers=1))
    job_driver.wait_running_pods(namespace, "owned", 2)
    # Hand-made, with the labels of a much later gang generation: adopted by
    # label it would raise restartCount to 7 and delete the live gang as stale.
    impostor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "owned-worker-9",
            "labels": {
                JOB_NAME_LABEL: "owned",
                ROLE_LABEL: "worker",
                NODE_RANK_LABEL: "1",
                RESTART_LABEL: "7",
            },
        },
        "spec": {
            **ON_FAKE_NODES["spec"],
            "containers": [{"name": "trainer", "image": "busybox"}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(impostor))
    # A real failure after it: the pass that restarts the gang has seen the
    # impostor (one watch, events in order), so its verdict is observable.
    job_driver.fail_pod(namespace, "owned-worker-0", exit_code=137)
    job_driver.wait_running_pods(namespace, "owned", 2, restart=1)
    assert job_driver.status(namespace, "owned")["restartCount"] == 1
    left = job_driver.get_core(namespace, "pods", "owned-worker-9")
    assert left is not None and not left["metadata"].get("deletionTimestamp")


def _plural(kind: str) -> str:
    return {"Service": "services", "PersistentVolumeClaim": "persistentvolumeclaims"}[kind]
