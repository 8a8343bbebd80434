"""spec.runtimeRef through a whole pass (policy/runtime.py, applied in
reconcile.plan before the spec is validated): resolved once and recorded, a
missing runtime waited for, an invalid merge refused naming its side."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.runtime_merge import spec_hash
from torchfleet_operator.observed import Observed, ObservedRuntime
from torchfleet_operator.planning import Plan
from torchfleet_operator.policy.runtime import merged_spec, reference
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status import conditions

from .builders import CONFIG, at, job

RUNTIME_SPEC: dict[str, Any] = {
    "image": "registry.example/train:1",
    "network": {"ncclEnv": {"NCCL_DEBUG": "WARN"}},
    "worker": {
        "template": {
            "spec": {
                "nodeSelector": {"pool": "gpu"},
                "containers": [{"name": "trainer", "env": [{"name": "FROM", "value": "rt"}]}],
            }
        }
    },
}
REF = {"kind": c.CLUSTER_RUNTIME_KIND, "name": "gpu"}


def _runtime(spec: dict[str, Any] = RUNTIME_SPEC, generation: int = 1) -> ObservedRuntime:
    return ObservedRuntime(c.CLUSTER_RUNTIME_KIND, "gpu", generation, spec)


def _job(**spec: Any) -> dict[str, Any]:
    return job(workers=1, runtimeRef=REF, command=["torchrun", "train.py"], **spec)


def _condition(decided: Plan, type_: str) -> dict[str, Any]:
    found = conditions.find(decided.status.get("conditions"), type_)
    assert found is not None, decided.status
    return found


def _pods(decided: Plan) -> list[dict[str, Any]]:
    """The gang's pods the plan makes (created, or first dry-run), by name."""
    made = [m for m in decided.dry_run + decided.create if m["kind"] == "Pod"]
    return list({m["metadata"]["name"]: m for m in made}.values())


def _containers(decided: Plan) -> list[dict[str, Any]]:
    return [m["spec"]["containers"][0] for m in _pods(decided)]


def test_reference_reads_the_raw_spec() -> None:
    assert reference({"runtimeRef": {"name": "x"}}) == (c.CLUSTER_RUNTIME_KIND, "x")
    assert reference({"runtimeRef": {"kind": c.RUNTIME_KIND, "name": "x"}}) == (
        c.RUNTIME_KIND,
        "x",
    )
    assert reference({}) is None
    assert reference({"runtimeRef": "x"}) is None
    assert reference(None) is None


def test_a_missing_runtime_waits_with_its_condition() -> None:
    decided = plan(_job(), Observed(), at(0), CONFIG, status={})
    assert decided.create == [] and decided.dry_run == []
    assert decided.status["phase"] == c.PHASE_PENDING
    waiting = _condition(decided, r.CONDITION_RUNTIME_RESOLVED)
    assert (waiting["status"], waiting["reason"]) == ("False", r.REASON_RUNTIME_NOT_FOUND)
    assert "ClusterTrainingRuntime gpu, which does not exist" in waiting["message"]
    assert "runtime" not in decided.status


def test_a_namespaced_runtime_missing_names_the_namespace() -> None:
    body = job(workers=1, runtimeRef={"kind": c.RUNTIME_KIND, "name": "gpu"})
    waiting = _condition(plan(body, Observed(), at(0), CONFIG), r.CONDITION_RUNTIME_RESOLVED)
    assert "TrainingRuntime gpu, which does not exist in namespace team" in waiting["message"]


def test_the_first_pass_that_finds_it_records_it_and_runs_the_merged_spec() -> None:
    body = _job(
        worker={
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [{"name": "trainer", "env": [{"name": "OWN", "value": "job"}]}]
                }
            },
        }
    )
    decided = plan(body, Observed(runtime=_runtime(generation=4)), at(0), CONFIG, status={})
    assert decided.status["runtime"] == {
        "kind": c.CLUSTER_RUNTIME_KIND,
        "name": "gpu",
        "generation": 4,
        "hash": spec_hash(RUNTIME_SPEC),
        "spec": RUNTIME_SPEC,
    }
    resolved = _condition(decided, r.CONDITION_RUNTIME_RESOLVED)
    assert (resolved["status"], resolved["reason"]) == ("True", r.REASON_RUNTIME_RESOLVED)
    assert "generation 4" in resolved["message"]
    pods = _pods(decided)
    assert len(pods) == 2
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {RUNTIME_SPEC["image"]}
    [worker] = [p for p in pods if "worker" in p["metadata"]["name"]]
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["FROM"] == "rt" and env["OWN"] == "job" and env["NCCL_DEBUG"] == "WARN"
    assert worker["spec"]["nodeSelector"]["pool"] == "gpu"


def _recorded(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "runtime": {
            "kind": c.CLUSTER_RUNTIME_KIND,
            "name": "gpu",
            "generation": 1,
            "hash": spec_hash(spec),
            "spec": spec,
        },
    }


def test_a_recorded_runtime_is_kept_whatever_the_runtime_is_now() -> None:
    edited = {**RUNTIME_SPEC, "image": "registry.example/train:2"}
    for now in (_runtime(edited, generation=2), None):  # edited, then deleted
        status = _recorded(RUNTIME_SPEC)
        decided = plan(_job(), Observed(runtime=now), at(0), CONFIG, status=status)
        pods = _pods(decided)
        assert len(pods) == 2 and {p["spec"]["containers"][0]["image"] for p in pods} == {
            RUNTIME_SPEC["image"]
        }
        assert decided.status["runtime"] == status["runtime"]


def test_an_invalid_merge_fails_the_job_naming_the_field_and_its_side() -> None:
    runtime = _runtime({"network": {"transport": "tcp"}})
    body = _job(network={"transport": "auto", "ibHCAs": ["mlx5_0"]})
    decided = plan(body, Observed(runtime=runtime), at(0), CONFIG, status={})
    assert decided.create == [] and decided.status["phase"] == c.PHASE_FAILED
    failed = _condition(decided, c.PHASE_FAILED)
    assert failed["reason"] == r.REASON_INVALID_SPEC
    assert failed["message"].startswith("spec.network.ibHCAs (from the job): ")
    assert "needs an RDMA transport" in failed["message"]

    runtime = _runtime({"processesPerNode": "gpu"})
    decided = plan(_job(), Observed(runtime=runtime), at(0), CONFIG, status={})
    failed = _condition(decided, c.PHASE_FAILED)
    assert failed["message"].startswith("spec.processesPerNode (from ClusterTrainingRuntime gpu): ")


def test_a_job_without_a_runtime_ref_ignores_any_runtime() -> None:
    body = job(workers=1, command=["torchrun", "train.py"])
    decided = plan(body, Observed(runtime=_runtime()), at(0), CONFIG, status={})
    assert "runtime" not in decided.status
    assert conditions.find(decided.status["conditions"], r.CONDITION_RUNTIME_RESOLVED) is None
    assert all(c["image"] != RUNTIME_SPEC["image"] for c in _containers(decided))


@pytest.mark.parametrize(
    ("case", "recorded", "found", "expected_class"),
    [
        ("no runtime named", None, None, "job-class"),
        (
            "recorded: the record, not the runtime now",
            "recorded-class",
            "edited-class",
            "recorded-class",
        ),
        ("not recorded yet: the runtime the watch has", None, "found-class", "found-class"),
        ("waiting for its runtime: the job's own", None, None, None),
    ],
)
def test_merged_spec_is_the_spec_the_pass_plans(
    case: str, recorded: str | None, found: str | None, expected_class: str | None
) -> None:
    def runtime_with(priority_class: str) -> dict[str, Any]:
        return {**RUNTIME_SPEC, "scheduling": {"priorityClassName": priority_class}}

    if case == "no runtime named":
        body = job(workers=1, scheduling={"priorityClassName": "job-class"})
    else:
        body = _job()
    if recorded is not None:
        body["status"] = {"runtime": {**REF, "generation": 1, "spec": runtime_with(recorded)}}
    watched = _runtime(runtime_with(found)) if found is not None else None
    merged = merged_spec(body, watched)
    assert (merged.get("scheduling") or {}).get("priorityClassName") == expected_class, case
    if found is not None:  # the job's own fields still win
        assert merged["command"] == ["torchrun", "train.py"]
