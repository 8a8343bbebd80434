"""What the CRD's PodSpec schema cannot check, the API server's validation of the
pods does: the operator dry-runs a new gang's first pod of each role server-side,
so an invalid template creates no pod at all, not a master without workers."""

from __future__ import annotations

import re

import pytest

from tests.fixtures.operator import ON_FAKE_NODES
from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster

# Valid for the schema (every field well typed); invalid as a pod: no volume "nope".
MOUNTS_A_MISSING_VOLUME = {
    "spec": {
        **ON_FAKE_NODES["spec"],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}],
    }
}


def test_an_invalid_worker_template_creates_no_pod_and_says_why(
    shared_operator, job_driver, namespace
):
    body = spec(workers=2)
    body["worker"]["template"] = MOUNTS_A_MISSING_VOLUME
    job_driver.create(namespace, "bad-mount", body)

    def refusal() -> dict | None:
        conditions = job_driver.status(namespace, "bad-mount").get("conditions", [])
        return next((c for c in conditions if '"nope"' in (c.get("message") or "")), None)

    condition = job_driver.wait_for("a condition naming the missing volume", refusal)
    # The API server's own words about the pod it refused, naming the field.
    assert condition["message"].startswith('Pod bad-mount-worker-0: Pod "bad-mount-worker-0"')
    assert re.search(r"volumeMounts\[\d+\]\.name", condition["message"]), condition
    # The pass that wrote it created nothing: the master was valid, but not its gang.
    assert job_driver.pods(namespace, "bad-mount") == []


def test_a_valid_gang_is_created_after_its_dry_run(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "good", spec(workers=2))
    assert len(job_driver.wait_running_pods(namespace, "good", 3)) == 3
