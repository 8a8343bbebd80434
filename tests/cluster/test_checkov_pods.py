"""checkov over the pods of a job running on the test cluster, as the API
server holds them (its defaults filled in, the operator's real path): each
finding is fixed or has its reason in tests/checkov-skips.yaml (scope:
running). The pods of every example, built offline:
tests/unit/operator/test_checkov_pods.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.checkov import assert_explained, load_skips, scan, write_documents
from tests.fixtures.operator import kwok_job_spec as spec

pytestmark = pytest.mark.cluster


def test_the_pods_of_a_running_job_pass_checkov_or_say_why(
    shared_operator, job_driver, namespace, tmp_path: Path
):
    job_driver.create(namespace, "scanned", spec(workers=1, resources={"cpu": 1, "memory": "1Gi"}))
    pods = job_driver.wait_running_pods(namespace, "scanned", 2)
    # A list's items carry no kind of their own.
    write_documents(
        tmp_path / "running.yaml", [{"apiVersion": "v1", "kind": "Pod"} | p for p in pods]
    )
    assert_explained(scan(tmp_path), load_skips("running"))
