"""Runtimes against a real API server, the shared operator (the chart's RBAC)
and KWOK: a job on a runtime runs the merged spec; the runtime is resolved
once (editing or deleting it changes no job that resolved it, and applies to
the next); a missing runtime is waited for; an invalid merge is refused naming
the field and its side (a status condition: the API server's CEL sees the job
alone, never its runtime)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.fixtures.operator import ON_FAKE_NODES
from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.status import conditions

pytestmark = pytest.mark.cluster

API = "/apis/torchfleet.dev/v1alpha1"
COMMAND = ["torchrun", "train.py"]


def runtime_spec(image: str) -> dict[str, Any]:
    """A platform team's runtime: image, KWOK's nodes, env, NCCL, CPU."""
    template = {
        "metadata": {"labels": {"team": "platform"}},
        "spec": {
            **ON_FAKE_NODES["spec"],
            "containers": [
                {
                    "name": "trainer",
                    "env": [
                        {"name": "FROM_RUNTIME", "value": "yes"},
                        {"name": "SHARED", "value": "runtime"},
                    ],
                }
            ],
        },
    }
    return {
        "image": image,
        "resources": {"cpu": "2"},
        "network": {"ncclEnv": {"NCCL_DEBUG": "WARN"}},
        "runPolicy": {"backoffLimit": 5},
        "master": {"template": template},
        "worker": {"template": template},
    }


class Runtimes:
    """Creates, edits and deletes runtimes; removes what it made."""

    def __init__(self, job_driver: Any) -> None:
        self.raw = job_driver.raw
        self.made: list[str] = []

    @staticmethod
    def path(kind: str, name: str = "", namespace: str = "") -> str:
        if kind == c.RUNTIME_KIND:
            base = f"{API}/namespaces/{namespace}/{c.RUNTIME_PLURAL}"
        else:
            base = f"{API}/{c.CLUSTER_RUNTIME_PLURAL}"
        return f"{base}/{name}" if name else base

    def create(self, kind: str, name: str, spec: dict[str, Any], namespace: str = "") -> None:
        body = {
            "apiVersion": c.API_VERSION,
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        self.raw.request("POST", self.path(kind, namespace=namespace), body)
        self.made.append(self.path(kind, name, namespace))

    def patch(self, kind: str, name: str, patch: dict[str, Any], namespace: str = "") -> None:
        self.raw.request(
            "PATCH",
            self.path(kind, name, namespace),
            patch,
            content_type="application/merge-patch+json",
        )

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        self.raw.request("DELETE", self.path(kind, name, namespace))


@pytest.fixture
def runtimes(job_driver: Any) -> Iterator[Runtimes]:
    made = Runtimes(job_driver)
    yield made
    for path in made.made:
        with contextlib.suppress(ApiException):  # deleted by the test already
            made.raw.request("DELETE", path)


def trainer_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in pod["spec"]["containers"] if x["name"] == "trainer")


def _env(pod: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in trainer_of(pod).get("env") or ()}


def job_on(runtime_kind: str, runtime_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "runtimeRef": {"kind": runtime_kind, "name": runtime_name},
        "command": COMMAND,
        **spec,
    }


def test_a_job_on_a_cluster_runtime_runs_the_merged_spec(
    shared_operator, job_driver, runtimes, namespace
):
    name = f"{namespace}-gpu"  # cluster-scoped: one per test's namespace
    runtimes.create(c.CLUSTER_RUNTIME_KIND, name, runtime_spec("example.com/train:1"))
    own = {
        "spec": {"containers": [{"name": "trainer", "env": [{"name": "SHARED", "value": "job"}]}]}
    }
    job_driver.create(
        namespace,
        "merged",
        job_on(c.CLUSTER_RUNTIME_KIND, name, worker={"replicas": 1, "template": own}),
    )
    pods = job_driver.wait_running_pods(namespace, "merged", 2)

    for pod in pods:
        assert trainer_of(pod)["image"] == "example.com/train:1"
        assert trainer_of(pod)["command"][:2] == COMMAND
        assert trainer_of(pod)["resources"]["requests"]["cpu"] == "2"
        assert pod["spec"]["nodeSelector"] == ON_FAKE_NODES["spec"]["nodeSelector"]
        assert pod["metadata"]["labels"]["team"] == "platform"
        env = _env(pod)
        assert env["FROM_RUNTIME"] == "yes" and env["NCCL_DEBUG"] == "WARN"
    shared = {p["metadata"]["labels"]["torchfleet.dev/role"]: _env(p)["SHARED"] for p in pods}
    assert shared == {"master": "runtime", "worker": "job"}  # env merged by name

    status = job_driver.status(namespace, "merged")
    recorded = status["runtime"]
    assert (recorded["kind"], recorded["name"], recorded["generation"]) == (
        c.CLUSTER_RUNTIME_KIND,
        name,
        1,
    )
    assert recorded["spec"]["image"] == "example.com/train:1" and len(recorded["hash"]) == 16
    resolved = conditions.find(status["conditions"], r.CONDITION_RUNTIME_RESOLVED)
    assert resolved is not None and resolved["status"] == "True"
    # The job itself still says only what its author wrote.
    assert "image" not in (job_driver.get(namespace, "merged") or {})["spec"]


def test_editing_or_deleting_the_runtime_changes_no_running_job_and_applies_to_the_next(
    shared_operator, job_driver, runtimes, namespace
):
    kind = c.RUNTIME_KIND
    runtimes.create(kind, "team", runtime_spec("example.com/train:1"), namespace)
    job_driver.create(namespace, "first", job_on(kind, "team", worker={"replicas": 1}))
    before = {p["metadata"]["uid"] for p in job_driver.wait_running_pods(namespace, "first", 2)}

    passes = shared_operator.passes((namespace, "first"))
    runtimes.patch(kind, "team", {"spec": {"image": "example.com/train:2"}}, namespace)
    # The next job resolves the runtime as it is now: the operator saw the edit.
    job_driver.create(namespace, "second", job_on(kind, "team", worker={"replicas": 1}))
    second = job_driver.wait_running_pods(namespace, "second", 2)
    assert {trainer_of(p)["image"] for p in second} == {"example.com/train:2"}
    assert job_driver.status(namespace, "second")["runtime"]["generation"] == 2
    # The edit's event queued the first job too (it names the runtime): its
    # pass has run and kept its pods and its record.
    shared_operator.wait_idle_after(passes, (namespace, "first"))
    pods = job_driver.wait_running_pods(namespace, "first", 2)
    assert {p["metadata"]["uid"] for p in pods} == before
    assert {trainer_of(p)["image"] for p in pods} == {"example.com/train:1"}
    assert job_driver.status(namespace, "first")["runtime"]["generation"] == 1

    # Deleted, it still leaves the first job its own: a gang restart makes
    # the new gang from the record.
    runtimes.delete(kind, "team", namespace)
    master = next(p for p in pods if p["metadata"]["labels"]["torchfleet.dev/role"] == "master")
    job_driver.fail_pod(namespace, master["metadata"]["name"])
    restarted = job_driver.wait_running_pods(namespace, "first", 2, restart=1)
    assert {trainer_of(p)["image"] for p in restarted} == {"example.com/train:1"}
    assert job_driver.status(namespace, "first")["runtime"]["generation"] == 1


def test_a_job_naming_a_missing_runtime_waits_and_starts_once_it_is_created(
    shared_operator, job_driver, runtimes, namespace
):
    kind = c.RUNTIME_KIND
    job_driver.create(namespace, "early", job_on(kind, "later", worker={"replicas": 1}))

    def waiting() -> dict[str, Any] | None:
        found = conditions.find(
            job_driver.status(namespace, "early").get("conditions"), r.CONDITION_RUNTIME_RESOLVED
        )
        return found if found and found["reason"] == r.REASON_RUNTIME_NOT_FOUND else None

    condition = job_driver.wait_for("the RuntimeNotFound condition", waiting, 30)
    assert condition["status"] == "False"
    assert (
        f"TrainingRuntime later, which does not exist in namespace {namespace}"
        in (condition["message"])
    )
    status = job_driver.status(namespace, "early")
    assert status["phase"] == c.PHASE_PENDING and "runtime" not in status
    assert job_driver.pods(namespace, "early") == []

    runtimes.create(kind, "later", runtime_spec("example.com/train:3"), namespace)
    pods = job_driver.wait_running_pods(namespace, "early", 2)
    assert {trainer_of(p)["image"] for p in pods} == {"example.com/train:3"}
    resolved = conditions.find(
        job_driver.status(namespace, "early")["conditions"], r.CONDITION_RUNTIME_RESOLVED
    )
    assert resolved is not None and resolved["status"] == "True"


def test_an_invalid_merge_fails_the_job_naming_the_field_and_its_side(
    shared_operator, job_driver, runtimes, namespace
):
    kind = c.RUNTIME_KIND
    tcp = {**runtime_spec("example.com/train:1"), "network": {"transport": "tcp"}}
    runtimes.create(kind, "tcp", tcp, namespace)
    # Valid alone (the API server takes it), invalid over a tcp runtime.
    job_driver.create(
        namespace,
        "rdma",
        job_on(kind, "tcp", network={"ibHCAs": ["mlx5_0"]}, worker={"replicas": 1}),
    )
    status = job_driver.wait_phase(namespace, "rdma", c.PHASE_FAILED)
    failed = conditions.find(status["conditions"], c.PHASE_FAILED)
    assert failed is not None and failed["reason"] == r.REASON_INVALID_SPEC
    assert failed["message"].startswith("spec.network.ibHCAs (from the job): ")
    assert "needs an RDMA transport" in failed["message"]

    gpu = {**runtime_spec("example.com/train:1"), "processesPerNode": "gpu"}
    runtimes.create(kind, "gpu", gpu, namespace)
    job_driver.create(namespace, "cpu", job_on(kind, "gpu", worker={"replicas": 1}))
    status = job_driver.wait_phase(namespace, "cpu", c.PHASE_FAILED)
    failed = conditions.find(status["conditions"], c.PHASE_FAILED)
    assert failed is not None
    assert failed["message"].startswith("spec.processesPerNode (from TrainingRuntime gpu): ")
    assert job_driver.pods(namespace, "rdma") == job_driver.pods(namespace, "cpu") == []


def test_runtime_ref_is_immutable(operator_crd, job_driver, namespace):
    job_driver.create(namespace, "fixed", job_on(c.RUNTIME_KIND, "a", suspend=True))
    with pytest.raises(ApiException) as refused:
        job_driver.patch(namespace, "fixed", {"spec": {"runtimeRef": {"name": "b"}}})
    assert refused.value.status == 422 and "spec.runtimeRef" in refused.value.body
