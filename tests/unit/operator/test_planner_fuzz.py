"""The planner under random input: whatever it reads, it never raises and never
plans anything outside its job (hypothesis).

Bodies are valid jobs, valid jobs with junk in places, or junk; pods are raw
manifests of any phase, container states, labels, owners and deletion marks,
read by the same parser the operator's cache uses; statuses and clocks are
random. Properties, for every draw:
- ``plan`` returns (never raises);
- every child it creates is in the job's namespace, controlled by the job;
- it never plans more pods than the spec's nodes, and none for a spec it
  cannot parse (elastic jobs, and junk in their status, included);
- it is idempotent: replanning the executed result at the same instant
  repeats no create or delete, and converges (nothing left to do, the same
  status) within a few passes.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torchfleet_operator.api.parse import InvalidSpecError, parse_training_job
from torchfleet_operator.desired.labels import (
    JOB_NAME_LABEL,
    NODE_RANK_LABEL,
    RESTART_LABEL,
    ROLE_LABEL,
)
from torchfleet_operator.observed import Observed, ObservedPod
from torchfleet_operator.planning import Plan
from torchfleet_operator.reconcile import plan

from .builders import CONFIG, T0, job

JOB = "fz"
PASSES_TO_CONVERGE = 4
NAMESPACE = "team"
UID = "uid-1"

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
small = st.integers(0, 6)
timestamps = st.integers(-3600, 3600).map(lambda s: (T0 + timedelta(seconds=s)).isoformat())


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"worker": {"replicas": draw(small)}}
    if draw(st.booleans()):
        spec["suspend"] = draw(st.booleans())
    if draw(st.booleans()):
        spec["runPolicy"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "backoffLimit": st.integers(0, 5),
                    "activeDeadlineSeconds": st.integers(1, 7200),
                    "ttlSecondsAfterFinished": st.integers(0, 600),
                    "successPolicy": st.sampled_from(["MasterExits", "AllWorkers"]),
                    "cleanPodPolicy": st.sampled_from(["All", "Running", "None"]),
                },
            )
        )
    if draw(st.booleans()):
        spec["checkpoint"] = {"claimTemplate": {"size": "1Gi"}}
    if draw(st.booleans()):
        spec["scheduling"] = {"podGroup": draw(st.sampled_from(["None", "Coscheduling"]))}
    if draw(st.booleans()):  # elastic, its bounds sometimes missing the desired size
        low = draw(st.integers(1, 7))
        high = draw(st.integers(low, 8))
        spec["elastic"] = {"minNodes": low, "maxNodes": high, "maxRestarts": draw(small)}
    if draw(st.integers(0, 4)) == 0:  # junk in one place of an otherwise valid spec
        spec[draw(st.sampled_from(["worker", "runPolicy", "master", "futureField"]))] = draw(junk)
    return spec


bodies = st.one_of(
    specs().map(lambda spec: job(JOB, **spec)),
    junk.map(lambda spec: {**job(JOB), "spec": spec}),
)


@st.composite
def pod_manifests(draw: st.DrawFn) -> dict[str, Any]:
    labels: dict[str, str] = {JOB_NAME_LABEL: JOB}
    for label, values in (
        (ROLE_LABEL, st.sampled_from(["master", "worker", "x"])),
        (NODE_RANK_LABEL, st.sampled_from(["0", "1", "2", "5", "-1", "x"])),
        (RESTART_LABEL, st.sampled_from(["0", "1", "2", "9", "x"])),
    ):
        if draw(st.integers(0, 9)):
            labels[label] = draw(values)
    rank = labels.get(NODE_RANK_LABEL, "0")
    role = labels.get(ROLE_LABEL, "worker")
    terminated = st.fixed_dictionaries(
        {"exitCode": st.sampled_from([0, 1, 137, 143, -1])},
        optional={"reason": st.text(max_size=6), "finishedAt": timestamps},
    )
    state = st.one_of(
        st.just({}),
        terminated.map(lambda t: {"terminated": t}),
        st.sampled_from(["ImagePullBackOff", "ErrImagePull", "ContainerCreating"]).map(
            lambda r: {"waiting": {"reason": r}}
        ),
        st.just({"running": {"startedAt": T0.isoformat()}}),
    )
    container = st.fixed_dictionaries({"name": st.sampled_from(["trainer", "sidecar"])}).flatmap(
        lambda c: state.map(lambda s: {**c, "state": s})
    )
    meta: dict[str, Any] = {
        "name": draw(st.sampled_from([f"{JOB}-{role}-{rank}", f"{JOB}-master-0", "other"])),
        "namespace": NAMESPACE,
        "uid": draw(st.text("abcdef0123", min_size=1, max_size=6)),
        "labels": labels,
        "ownerReferences": draw(
            st.sampled_from([[{"uid": UID, "controller": True}], [{"uid": "other"}], []])
        ),
    }
    if draw(st.integers(0, 4)) == 0:
        meta["deletionTimestamp"] = T0.isoformat()
    status = {
        "phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"])),
        "containerStatuses": draw(st.lists(container, max_size=2)),
        "conditions": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(["PodScheduled", "DisruptionTarget", "Ready"]),
                        "status": st.sampled_from(["True", "False"]),
                    },
                    optional={"reason": st.text(max_size=6), "message": st.text(max_size=8)},
                ),
                max_size=2,
            )
        ),
    }
    if draw(st.booleans()):
        status["reason"] = draw(st.sampled_from(["Evicted", "Preempting", "OutOfcpu", ""]))
    return {
        "metadata": meta,
        "spec": {"nodeName": draw(st.sampled_from(["n1", "n2"]))},
        "status": status,
    }


statuses = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "phase": st.sampled_from(
                ["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "?"]
            ),
            "restartCount": st.integers(0, 9),
            "elastic": st.fixed_dictionaries(
                {},
                optional={
                    "replacements": st.integers(0, 9) | junk,
                    "countedReplacements": st.integers(0, 9) | junk,
                    "replacing": st.dictionaries(
                        st.sampled_from([f"{JOB}-worker-{i}" for i in range(3)]),
                        st.sampled_from(["", f"{JOB}-uid"]) | junk,
                        max_size=2,
                    )
                    | junk,
                },
            )
            | junk,
            "startTime": timestamps,
            "completionTime": timestamps,
            "observedGeneration": st.integers(0, 2),
            "conditions": st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(["Running", "Restarting", "Failed", "Created"]),
                        "status": st.sampled_from(["True", "False"]),
                        "reason": st.text(max_size=6),
                        "lastTransitionTime": timestamps,
                    }
                ),
                max_size=3,
            ),
        },
    ),
)


def _executed(observed: Observed, first: Plan) -> Observed:
    """What the controller feeds the next pass: its creates and deletes recorded
    as expectations until the watch reports them (controller._remember)."""
    created = {m["metadata"]["name"] for m in first.create if m["kind"] == "Pod"}
    deleted = {ref.uid for ref in first.delete if ref.uid}
    kinds = {m["kind"] for m in first.create}
    return dataclasses.replace(
        observed,
        expected_created=observed.expected_created | created,
        expected_deleted=observed.expected_deleted | deleted,
        has_service=observed.has_service or "Service" in kinds,
        has_checkpoint_claim=observed.has_checkpoint_claim or "PersistentVolumeClaim" in kinds,
    )


def _parses(body: dict[str, Any]) -> bool:
    try:
        parse_training_job(body)
    except InvalidSpecError:
        return False
    return True


# Derandomized: the same 500 draws in every run, so `make test` cannot turn red on a
# draw no earlier run made (to explore new draws, run it locally with derandomize=False).
@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    body=bodies,
    manifests=st.lists(pod_manifests(), max_size=5),
    status=statuses,
    seconds=st.integers(-60, 7200),
    has_service=st.booleans(),
)
def test_the_planner_survives_anything_and_stays_inside_its_job(
    body, manifests, status, seconds, has_service
):
    pods = tuple(p for m in manifests if (p := ObservedPod.from_manifest(m)) is not None)
    # Only the job's own pods reach the planner (controller.snapshot).
    observed = Observed(pods=tuple(p for p in pods if p.owner_uid == UID), has_service=has_service)
    now = T0 + timedelta(seconds=seconds)

    first = plan(body, observed, now, CONFIG, status=status)

    for manifest in first.create:
        meta = manifest["metadata"]
        assert meta.get("namespace", NAMESPACE) == NAMESPACE, manifest
        owners = [r for r in meta.get("ownerReferences") or () if r.get("controller")]
        assert [r["uid"] for r in owners] == [UID], manifest
    new_pods = [m for m in first.create if m["kind"] == "Pod"]
    if not _parses(body):
        assert new_pods == []
    else:
        spec = parse_training_job(body).spec
        assert len(new_pods) <= spec.nodes
    assert all(ref.kind == "Pod" for ref in first.delete)
    # What the draws reached (pytest --hypothesis-show-statistics).
    event(f"phase {first.status.get('phase')}")
    event("creates pods" if new_pods else "creates no pod")
    event("deletes pods" if first.delete else "deletes no pod")
    if any(e.reason == "WorkerReplaced" for e in first.events):
        event("replaces an elastic worker")

    # Replanned at the same instant over what was executed, it converges: no
    # create or delete is ever repeated, and within a few passes (a gang
    # restart takes two: delete, then create) it plans nothing and the status
    # stops changing.
    created, deleted = set(), set()
    decided = first
    for _ in range(PASSES_TO_CONVERGE):
        names = {m["metadata"]["name"] for m in decided.create if m["kind"] == "Pod"}
        uids = {r.uid for r in decided.delete}
        assert not names & created and not uids & deleted, (names, uids)
        created |= names
        deleted |= uids
        observed = _executed(observed, decided)
        previous, decided = decided, plan(body, observed, now, CONFIG, status=decided.status)
    assert decided.create == [] and decided.delete == [], (decided.create, decided.delete)
    assert decided.status == previous.status
