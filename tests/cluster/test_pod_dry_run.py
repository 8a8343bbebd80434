"""What the CRD's PodSpec schema cannot check, the API server's validation of the
pods does. A new gang's master is created alone first, and a worker template of
its own is dry-run server-side before that, so an invalid template creates no
pod at all, not a master without workers, and the job fails (InvalidSpec) in
the API server's words instead of retrying."""

from __future__ import annotations

import re

import pytest

from tests.fixtures.operator import ON_FAKE_NODES
from tests.fixtures.operator import kwok_job_spec as spec
from torchfleet_operator.status.conditions import find

pytestmark = pytest.mark.cluster

# Valid for the schema (every field well typed); invalid as a pod: no volume "nope".
MOUNTS_A_MISSING_VOLUME = {
    "spec": {
        **ON_FAKE_NODES["spec"],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}],
    }
}


def test_an_invalid_worker_template_creates_no_pod_and_fails_the_job_saying_why(
    shared_operator, job_driver, namespace
):
    body = spec(workers=2)
    body["worker"]["template"] = MOUNTS_A_MISSING_VOLUME
    job_driver.create(namespace, "bad-mount", body)

    def failed() -> dict | None:
        status = job_driver.status(namespace, "bad-mount")
        found = find(status.get("conditions"), "Failed")
        return found if status.get("phase") == "Failed" else None

    # Permanent (422): failed once, not retried for ever like a quota refusal.
    condition = job_driver.wait_for("the job Failed as an invalid spec", failed)
    assert condition["reason"] == "InvalidSpec", condition
    # The API server's own words about the pod it refused, naming the field.
    assert 'Pod bad-mount-worker-0: Pod "bad-mount-worker-0"' in condition["message"]
    assert re.search(r"volumeMounts\[\d+\]\.name", condition["message"]), condition
    # Nothing was created: the master was valid, but not its gang.
    assert job_driver.pods(namespace, "bad-mount") == []


def test_an_invalid_template_of_both_roles_is_refused_at_the_master_and_creates_nothing(
    shared_operator, job_driver, namespace
):
    body = spec(workers=2)
    body["master"] = {"template": MOUNTS_A_MISSING_VOLUME}
    body["worker"]["template"] = MOUNTS_A_MISSING_VOLUME
    refusals = {"verb": "create", "resource": "Pod", "code": "422"}
    before = shared_operator.metric("torchfleet_operator_api_errors_total", **refusals)
    job_driver.create(namespace, "bad-both", body)

    def failed() -> dict | None:
        status = job_driver.status(namespace, "bad-both")
        found = find(status.get("conditions"), "Failed")
        return found if status.get("phase") == "Failed" else None

    condition = job_driver.wait_for("the job Failed as an invalid spec", failed)
    assert condition["reason"] == "InvalidSpec", condition
    assert 'Pod bad-both-master-0: Pod "bad-both-master-0"' in condition["message"]
    # Slow start: the workers were never sent once their master was refused.
    assert job_driver.pods(namespace, "bad-both") == []
    assert shared_operator.metric("torchfleet_operator_api_errors_total", **refusals) == before + 1


def test_a_valid_gang_is_created_after_its_dry_run(shared_operator, job_driver, namespace):
    job_driver.create(namespace, "good", spec(workers=2))
    assert len(job_driver.wait_running_pods(namespace, "good", 3)) == 3
