"""A job's resolved runtime survives the operator: a new operator process,
which remembers nothing, reads the record back from the job's status and
makes the next gang from it, not from the runtime as edited meanwhile.

Its own operators (no shared one): the test stops and starts them.
"""

from __future__ import annotations

import pytest

from tests.cluster.test_runtimes import Runtimes, job_on, runtime_spec, trainer_of
from torchfleet_operator.api import constants as c

pytestmark = pytest.mark.cluster


def test_a_restarted_operator_keeps_the_resolved_runtime(operator_factory, job_driver, namespace):
    runtimes = Runtimes(job_driver)
    kind = c.RUNTIME_KIND
    first = operator_factory(namespaces=[namespace])
    runtimes.create(kind, "team", runtime_spec("example.com/train:1"), namespace)
    job_driver.create(namespace, "kept", job_on(kind, "team", worker={"replicas": 1}))
    pods = job_driver.wait_running_pods(namespace, "kept", 2)
    first.stop()

    runtimes.patch(kind, "team", {"spec": {"image": "example.com/train:2"}}, namespace)
    operator_factory(namespaces=[namespace])
    master = next(p for p in pods if p["metadata"]["labels"]["torchfleet.dev/role"] == "master")
    job_driver.fail_pod(namespace, master["metadata"]["name"])
    restarted = job_driver.wait_running_pods(namespace, "kept", 2, restart=1)
    assert {trainer_of(p)["image"] for p in restarted} == {"example.com/train:1"}
    recorded = job_driver.status(namespace, "kept")["runtime"]
    assert (recorded["generation"], recorded["spec"]["image"]) == (1, "example.com/train:1")
