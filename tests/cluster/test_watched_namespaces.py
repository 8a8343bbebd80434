"""Jobs that are gone while kopf's index still holds them, against a real
apiserver.

An operator that watches namespaces by pattern (``--namespace 'team-*'``, the
chart's watchNamespaces): a job whose namespace is deleted is forgotten, and a
job of the same name in the namespace made again runs as a new job. kopf
watches each matching namespace with a stream of its own and stops that stream
once the namespace is gone, without the DELETED events of what was in it: its
indices keep the deleted job, which the operator then reconciled forever
(creating its pods again every few seconds, refused with 404: namespace not
found).

Whatever else loses a DELETED event, the API server's refusals say the job is
gone (a create in its namespace: 404 naming the namespace; its status: 404),
and the pass that meets them forgets it. A TrainingRuntime of a deleted
namespace, held the same way, is never resolved again.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tests.cluster.test_runtimes import Runtimes, job_on, runtime_spec
from tests.fixtures.operator import kwok_job_spec as spec
from tests.fixtures.poll import wait_for
from torchfleet_operator.api.constants import RUNTIME_KIND
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.controller import Controller
from torchfleet_operator.kube import Executor
from torchfleet_operator.observed import ObservedRuntime

pytestmark = pytest.mark.cluster

API_ERRORS = "torchfleet_operator_api_errors_total"


def _make_namespace(cluster: Any, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    wait_for(
        f"namespace {name}'s default ServiceAccount",
        lambda: not cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode,
        timeout=60,
    )


def _series_of(operator: Any, namespace: str) -> list[str]:
    """The operator's per-job metric lines for jobs in ``namespace``."""
    return [
        line
        for line in operator.metrics().splitlines()
        if f'job_namespace="{namespace}"' in line and not line.startswith("#")
    ]


def test_a_deleted_namespaces_job_is_forgotten_and_its_namesake_runs(
    operator_factory, job_driver, cluster
):
    prefix = f"glob-{uuid.uuid4().hex[:6]}-"
    operator = operator_factory(namespaces=[prefix + "*"])
    namespace = prefix + "team"
    _make_namespace(cluster, namespace)
    first = job_driver.create(namespace, "train", spec(workers=1))
    job_driver.wait_running_pods(namespace, "train", 2)
    # Finished: no pass of it calls the API server any more, so no refusal can
    # tell the operator it is gone; only the namespace's deletion does.
    job_driver.succeed_pod(namespace, "train-master-0")
    job_driver.wait_phase(namespace, "train", "Succeeded")
    assert operator.passes((namespace, "train")) > 0

    cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")
    wait_for(
        "the operator to forget the deleted namespace's job",
        lambda: not _series_of(operator, namespace),
        timeout=60,
        explain=lambda: "\n".join(_series_of(operator, namespace)) + "\n" + operator.logs(),
    )
    refused = operator.metric(API_ERRORS, verb="create", code="404")

    # The same names again: a new job (a new uid), which the operator runs.
    _make_namespace(cluster, namespace)
    second = job_driver.create(namespace, "train", spec(workers=1))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    pods = job_driver.wait_running_pods(namespace, "train", 2)
    owners = {ref["uid"] for pod in pods for ref in pod["metadata"]["ownerReferences"]}
    assert owners == {second["metadata"]["uid"]}
    # Nothing more was tried for the job that is gone, while its namesake started.
    assert operator.metric(API_ERRORS, verb="create", code="404") == refused, operator.logs()
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.mark.parametrize("what_went", ["the job", "its namespace"])
def test_a_pass_over_a_job_the_api_server_no_longer_has_forgets_it(
    what_went, cluster, operator_crd, job_driver
):
    """The index (seeded here, as a lost DELETED event leaves it) holds a job the
    API server no longer has: the pass's refusals prove it gone, and no pass
    runs for it again."""
    namespace = f"gone-{uuid.uuid4().hex[:6]}"
    _make_namespace(cluster, namespace)
    body = job_driver.create(namespace, "train", spec(workers=0))
    key = (namespace, "train")
    if what_went == "the job":
        job_driver.delete(*key)
        wait_for("the job deleted", lambda: job_driver.get(*key) is None, timeout=30)
    else:
        cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")
    controller = Controller(OperatorConfig(), Executor(cluster.api_client(), 1), "image:1")
    controller.caches.jobs = {key: [body]}
    try:
        snapshot = controller.snapshot(key)
        assert snapshot is not None
        assert controller.reconcile(key, snapshot) is None  # nothing to come back for
    finally:
        controller.executor.close()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert controller.snapshot(key) is None  # passed over from now on


def test_a_deleted_namespaces_jobs_are_checked_by_one_list_and_the_gone_forgotten(
    cluster, operator_crd, job_driver
):
    """kopf's event of a watched namespace's deletion (Controller.namespace_deleted):
    the index still holds a job of the namespace as it was and one of the
    namespace made again under the same name; the list of the namespace's jobs
    keeps the new one and forgets the old, whose passes would call the API server
    for nothing (a finished job's would not even be refused)."""
    namespace = f"again-{uuid.uuid4().hex[:6]}"
    _make_namespace(cluster, namespace)
    old = job_driver.create(namespace, "train", spec(workers=0))
    cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")
    _make_namespace(cluster, namespace)
    new = job_driver.create(namespace, "train", spec(workers=0))
    key = (namespace, "train")
    controller = Controller(OperatorConfig(), Executor(cluster.api_client(), 1), "image:1")
    controller.caches.jobs = {key: [old, new]}
    try:
        asyncio.run(controller.namespace_deleted(namespace))
        snapshot = controller.snapshot(key)
        assert snapshot is not None and snapshot.body["metadata"]["uid"] == new["metadata"]["uid"]
        controller.caches.jobs = {key: [old]}  # as if the new one were not listed yet
        assert controller.snapshot(key) is None
    finally:
        controller.executor.close()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_deleted_namespaces_runtime_is_not_resolved_for_a_job_of_the_namespace_made_again(
    cluster, operator_crd, job_driver
):
    """The index still holds the TrainingRuntime of a deleted namespace (kopf's
    stream stopped without its DELETED event): once the namespace's deletion is
    heard (Controller.namespace_deleted, one list of its runtimes), a job of the
    namespace made again waits for a runtime of its own instead of resolving the
    deleted one, and takes the new runtime of that name once there is one."""
    namespace = f"rt-again-{uuid.uuid4().hex[:6]}"
    made = Runtimes(job_driver)

    def made_runtime(image: str) -> ObservedRuntime:
        made.create(RUNTIME_KIND, "gpu", runtime_spec(image), namespace)
        body = job_driver.raw.request("GET", Runtimes.path(RUNTIME_KIND, "gpu", namespace))
        return ObservedRuntime.from_manifest(body)

    _make_namespace(cluster, namespace)
    old = made_runtime("old:1")
    cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")
    _make_namespace(cluster, namespace)
    job = job_driver.create(namespace, "train", job_on(RUNTIME_KIND, "gpu"))
    key = (namespace, "train")
    controller = Controller(OperatorConfig(), Executor(cluster.api_client(), 1), "image:1")
    controller.caches.jobs = {key: [job]}
    controller.caches.runtimes = {(namespace, "gpu"): [old]}

    def resolved() -> ObservedRuntime | None:
        snapshot = controller.snapshot(key)
        assert snapshot is not None
        return snapshot.observed.runtime

    try:
        assert resolved() == old  # what the stale index offers before the event
        asyncio.run(controller.namespace_deleted(namespace))
        assert resolved() is None
        new = made_runtime("new:1")
        controller.caches.runtimes = {(namespace, "gpu"): [old, new]}
        assert resolved() == new
        assert new.spec["image"] == "new:1"
    finally:
        controller.executor.close()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
