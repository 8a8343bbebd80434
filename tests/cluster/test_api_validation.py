"""The CRD on a real API server: invalid jobs rejected naming the field,
examples accepted, transition rules, kubectl explain and printer columns."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.api import TrainingJobs
from tests.fixtures.poll import wait_for
from tests.unit.api.cases import (
    DEEPSPEED_ACCEPTED,
    ELASTIC_ACCEPTED,
    INVALID,
    KNOBS_ACCEPTED,
    RICH_POD_SPEC,
    Invalid,
    Manifest,
    job,
)
from torchfleet_operator.api import (
    Condition,
    ProgressStatus,
    ReplicaStatus,
    ReplicaStatuses,
    TrainingJobStatus,
    parse_training_job,
)

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_at_least_25_invalid_cases() -> None:
    assert len(INVALID) >= 25


@pytest.fixture(scope="module")
def validation_namespace(cluster: Any, trainingjob_crd: str) -> Any:
    name = f"api-validation-{int(time.time() * 1000) % 10**8}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("case", INVALID, ids=lambda case: case.id)
def test_api_server_rejects_naming_the_field(
    case: Invalid, trainingjobs: TrainingJobs, validation_namespace: str
) -> None:
    rejection = trainingjobs.admit(validation_namespace, case.manifest())
    assert rejection is not None, f"{case.id}: the API server accepted it"
    assert rejection.names(case.field), rejection.message
    assert case.says in rejection.message, rejection.message


def test_a_template_using_much_of_pod_spec_is_accepted(
    trainingjobs: TrainingJobs, validation_namespace: str
) -> None:
    """The same template the models accept (tests/unit/api/test_models.py)."""
    manifest = job("rich-template", {"worker": {"template": {"spec": RICH_POD_SPEC}}})
    assert trainingjobs.admit(validation_namespace, manifest) is None


@pytest.mark.parametrize(("id", "spec"), DEEPSPEED_ACCEPTED, ids=[i for i, _ in DEEPSPEED_ACCEPTED])
def test_a_deepspeed_command_launching_its_own_node_is_accepted(
    id: str, spec: Manifest, trainingjobs: TrainingJobs, validation_namespace: str
) -> None:
    """The same commands the models accept (tests/unit/api/test_models.py)."""
    assert trainingjobs.admit(validation_namespace, job(id, spec)) is None


@pytest.mark.parametrize(("id", "spec"), KNOBS_ACCEPTED, ids=[i for i, _ in KNOBS_ACCEPTED])
def test_a_template_may_set_the_trainers_knobs(
    id: str, spec: Manifest, trainingjobs: TrainingJobs, validation_namespace: str
) -> None:
    """The same env names the models accept (tests/unit/api/test_models.py)."""
    assert trainingjobs.admit(validation_namespace, job(id, spec)) is None


@pytest.mark.parametrize(("id", "spec"), ELASTIC_ACCEPTED, ids=[id for id, _ in ELASTIC_ACCEPTED])
def test_an_elastic_spec_within_its_bounds_is_accepted(
    id: str, spec: Manifest, trainingjobs: TrainingJobs, validation_namespace: str
) -> None:
    """The same specs the models accept (tests/unit/api/test_models.py)."""
    assert trainingjobs.admit(validation_namespace, job(id, spec)) is None


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_accepted_by_server_side_dry_run(
    path: Path, cluster: Any, trainingjob_crd: str, namespace: str
) -> None:
    out = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", str(path), "-o", "json"
    )
    admitted = json.loads(out.stdout)
    # What the server would store parses into the models, defaults included.
    assert (
        parse_training_job(admitted).metadata.name
        == yaml.safe_load(path.read_text())["metadata"]["name"]
    )


def _patch(
    cluster: Any, namespace: str, name: str, patch: dict[str, Any], check: bool = True
) -> Any:
    return cluster.kubectl(
        "patch", "tj", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch), check=check
    )


def test_pod_shaping_fields_change_only_while_suspended(
    cluster: Any, trainingjobs: TrainingJobs, namespace: str
) -> None:
    trainingjobs.create(namespace, job("shape", {"image": "trainer:1", "worker": {"replicas": 1}}))

    for patch, field in (
        ({"spec": {"image": "trainer:2"}}, "spec.image"),
        ({"spec": {"worker": {"replicas": 3}}}, "spec.worker"),
        ({"spec": {"resources": {"gpus": 1}}}, "spec.resources"),
    ):
        refused = _patch(cluster, namespace, "shape", patch, check=False)
        assert refused.returncode != 0 and field in refused.stderr, refused.stderr

    # Fields that do not shape pods change freely.
    _patch(cluster, namespace, "shape", {"spec": {"runPolicy": {"backoffLimit": 7}}})
    # Suspend, then reshape (as Kueue does before admitting), then resume in one go.
    _patch(cluster, namespace, "shape", {"spec": {"suspend": True}})
    _patch(cluster, namespace, "shape", {"spec": {"image": "trainer:2", "suspend": False}})
    stored = parse_training_job(trainingjobs.get(namespace, "shape")).spec
    assert (stored.image, stored.suspend, stored.run_policy.backoff_limit) == (
        "trainer:2",
        False,
        7,
    )


def test_an_elastic_jobs_worker_replicas_alone_change_while_it_runs(
    cluster: Any, trainingjobs: TrainingJobs, namespace: str
) -> None:
    elastic = {"elastic": {"minNodes": 2, "maxNodes": 4}, "worker": {"replicas": 1}}
    trainingjobs.create(namespace, job("grows", elastic))
    trainingjobs.create(namespace, job("fixed", {"worker": {"replicas": 1}}))

    # Within minNodes..maxNodes, up and down, while it runs.
    for replicas in (3, 2):
        _patch(cluster, namespace, "grows", {"spec": {"worker": {"replicas": replicas}}})
        assert trainingjobs.get(namespace, "grows")["spec"]["worker"]["replicas"] == replicas
    for patch, field in (
        # Past maxNodes: the elastic bounds say so.
        ({"spec": {"worker": {"replicas": 4}}}, "maxNodes"),
        # The template still shapes every pod: fixed while it runs.
        ({"spec": {"worker": {"template": {"metadata": {"labels": {"a": "b"}}}}}}, "spec.worker"),
    ):
        refused = _patch(cluster, namespace, "grows", patch, check=False)
        assert refused.returncode != 0 and field in refused.stderr, refused.stderr
    # A fixed gang's size is its shape: refused, and the message says what is allowed.
    refused = _patch(cluster, namespace, "fixed", {"spec": {"worker": {"replicas": 2}}}, False)
    assert refused.returncode != 0 and "elastic job's worker.replicas" in refused.stderr


def test_kubectl_explain_reads_the_descriptions(cluster: Any, trainingjob_crd: str) -> None:
    def explained() -> Any:
        out = cluster.kubectl("explain", "trainingjob.spec.network", check=False)
        return out if out.returncode == 0 else None

    # The OpenAPI document catches up with a new CRD within seconds.
    out = wait_for("kubectl explain to know the CRD", explained, 60, interval=1)
    assert "Transport, NICs, RDMA and NCCL settings." in out.stdout
    for field in ("ncclEnv", "ibHCAs", "gpuDirectRDMALevel", "hostNetwork", "rdmaResources"):
        assert field in out.stdout
    leaf = cluster.kubectl("explain", "tj.spec.runPolicy.restartPolicy").stdout
    assert "128 and above" in leaf
    elastic = cluster.kubectl("explain", "tj.spec.elastic").stdout
    for field in ("minNodes", "maxNodes", "maxRestarts", "rendezvous"):
        assert field in elastic


def test_status_from_the_models_is_stored_and_printed(
    cluster: Any, trainingjobs: TrainingJobs, namespace: str
) -> None:
    """The operator writes status through the status models: the schema must
    take it as is, and the printer columns must show it."""
    trainingjobs.create(namespace, job("printed", {"worker": {"replicas": 3}}))
    status = TrainingJobStatus(
        phase="Running",
        conditions=[
            Condition(
                type="Running",
                status="True",
                reason="AllPodsReady",
                message="4/4 pods ready",
                last_transition_time="2026-11-20T23:00:00Z",  # type: ignore[arg-type]
                observed_generation=1,
            )
        ],
        replica_statuses=ReplicaStatuses(
            master=ReplicaStatus(active=1, ready=1), worker=ReplicaStatus(active=3, ready=2)
        ),
        nodes_ready="3/4",
        restart_count=2,
        restarts=2,  # the Restarts column: gang plus in-place restarts
        progress=ProgressStatus(step=420, total_steps=1000, percent=42, loss=1.93),
        observed_generation=1,
    )
    # A JSON patch replaces the whole status (a merge patch would keep fields
    # another writer set).
    value = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    body = json.dumps([{"op": "add", "path": "/status", "value": value}])
    patch = ("patch", "tj", "printed", "-n", namespace, "--subresource=status", "--type=json")

    # An operator under test elsewhere may reconcile this job and write its own
    # status between our write and our read, so the stored status is checked in
    # the patch's own response, and the table is retried after a fresh write.
    for _attempt in range(5):
        written = json.loads(cluster.kubectl(*patch, "-p", body, "-o", "json").stdout)
        assert parse_training_job(written).status == status
        table = cluster.kubectl("get", "tj", "printed", "-n", namespace).stdout.splitlines()
        if table[1].split()[:5] == ["printed", "Running", "3/4", "2", "42"]:
            break
    else:
        pytest.fail(f"the printer columns never showed the status: {table}")
    assert table[0].split() == ["NAME", "PHASE", "NODES", "RESTARTS", "PROGRESS", "AGE"]
    listed = cluster.kubectl("get", "all", "-n", namespace, "-o", "name").stdout
    assert "trainingjob.torchfleet.dev/printed" in listed  # category "all"
