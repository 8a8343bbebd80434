"""Kueue's topology-aware scheduling (TAS): spec.scheduling.topology as the
PodSets' topologyRequest (desired/workload.py), and a TAS admission's
topologyAssignment as each pod's domain (policy/admission.py, policy/kueue.py)."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_operator.desired import workload as wl
from torchfleet_operator.observed import ObservedWorkload
from torchfleet_operator.policy import admission
from torchfleet_operator.reconcile import plan
from torchfleet_operator.status.conditions import find

from .builders import CONFIG, at, job, observed
from .test_kueue_admission import FLAVORS, cond, kueue, pods_of, spec_of, workload_manifest

RACK = "example.com/rack"
BLOCK = "example.com/block"
HOST = "kubernetes.io/hostname"


def topology_job(mode: str, workers: int = 3) -> dict[str, Any]:
    scheduling = {"queueName": "team-a", "topology": {"key": RACK, "mode": mode}}
    return job(workers=workers, scheduling=scheduling)


# ---- the request ---------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "field"), [("Required", "required"), ("Preferred", "preferred")])
def test_topology_becomes_one_grouped_request_for_master_and_workers(mode, field):
    sets = wl.pod_sets("llm", "team", "uid-1", spec_of(topology_job(mode)), "img")
    # One group: Kueue places the master with the workers, not each role apart.
    expected = {field: RACK, "podSetGroupName": "gang"}
    assert [(s["name"], s["topologyRequest"]) for s in sets] == [
        ("master", expected),
        ("worker", expected),
    ]


def test_a_master_alone_asks_without_a_group():
    # Kueue's groups have exactly two PodSets.
    (master,) = wl.pod_sets("llm", "team", "uid-1", spec_of(topology_job("Required", 0)), "img")
    assert master["topologyRequest"] == {"required": RACK}


def test_no_topology_no_request():
    sets = wl.pod_sets("llm", "team", "uid-1", spec_of(job(workers=2)), "img")
    assert all("topologyRequest" not in s for s in sets)


# ---- the assignment ------------------------------------------------------------------

LEVELS = [BLOCK, RACK, HOST]


def v1beta2_assignment() -> dict[str, Any]:
    """Kueue 0.17's compressed form: rack r1 of block b0, nodes n1 (1 pod) and n2 (2 pods)."""
    return {
        "levels": LEVELS,
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "b0"},
                    {"universal": "r1"},
                    {"individual": {"prefix": "n", "roots": ["1", "2"]}},
                ],
                "podCounts": {"individual": [1, 2]},
            }
        ],
    }


def node(host: str) -> dict[str, str]:
    return {BLOCK: "b0", RACK: "r1", HOST: host}


def test_v1beta2_slices_decode_to_one_domain_per_pod_in_rank_order():
    assert admission.topology_domains(v1beta2_assignment()) == (node("n1"), node("n2"), node("n2"))


def test_v1beta1_domains_decode_the_same():
    assignment = {
        "levels": LEVELS,
        "domains": [
            {"values": ["b0", "r1", "n1"], "count": 1},
            {"values": ["b0", "r1", "n2"], "count": 2},
        ],
    }
    assert admission.topology_domains(assignment) == (node("n1"), node("n2"), node("n2"))


def test_universal_counts_and_several_slices():
    assignment = {
        "levels": [RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [{"individual": {"roots": ["r1", "r2"], "suffix": "-x"}}],
                "podCounts": {"universal": 2},
            },
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": "r3"}],
                "podCounts": {"universal": 1},
            },
        ],
    }
    racks = [d[RACK] for d in admission.topology_domains(assignment) or ()]
    assert racks == ["r1-x", "r1-x", "r2-x", "r2-x", "r3"]


@pytest.mark.parametrize(
    "junk",
    [
        {"levels": []},
        {"levels": [RACK], "slices": [{"domainCount": 2, "valuesPerLevel": [{"universal": "r"}]}]},
        {"levels": [RACK, HOST], "domains": [{"values": ["r1"], "count": 1}]},
        {
            "levels": [RACK],
            "slices": [
                {
                    "domainCount": 2,
                    "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
                    "podCounts": {"universal": 1},
                }
            ],
        },
        {"levels": [RACK], "domains": "r1"},
    ],
)
def test_an_unreadable_assignment_is_a_value_error(junk):
    with pytest.raises(ValueError, match="topologyAssignment"):
        admission.topology_domains(junk)


def test_no_assignment_is_no_topology():
    assert admission.topology_domains(None) is None


def tas_admitted(master: dict[str, Any], workers: dict[str, Any], request: str = "required"):
    pod_sets = [
        {"name": name, "count": 1, "topologyRequest": {request: RACK, "podSetGroupName": "gang"}}
        for name in ("master", "worker")
    ]
    manifest = workload_manifest(
        [cond("QuotaReserved", reason="QuotaReserved"), cond("Admitted", reason="Admitted")],
        {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "master", "flavors": {"nvidia.com/gpu": "h100"}, "count": 1,
                 "topologyAssignment": master},
                {"name": "worker", "flavors": {"nvidia.com/gpu": "h100"}, "count": 3,
                 "topologyAssignment": workers},
            ],
        },
    )  # fmt: skip
    manifest["spec"]["podSets"] = pod_sets
    return manifest


MASTER_ON_N1 = {"levels": LEVELS, "domains": [{"values": ["b0", "r1", "n1"], "count": 1}]}


def test_each_pod_is_created_on_its_assigned_domain_with_the_marks_kueue_reads():
    manifest = tas_admitted(MASTER_ON_N1, v1beta2_assignment())
    p = plan(topology_job("Required"), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    pods = {m["metadata"]["name"]: m for m in pods_of(p)}
    hosts = {name: pod["spec"]["nodeSelector"][HOST] for name, pod in pods.items()}
    # Master first, then the workers in rank order, as Kueue's domains list them.
    assert list(hosts.items()) == [
        ("llm-master-0", "n1"),
        ("llm-worker-0", "n1"),
        ("llm-worker-1", "n2"),
        ("llm-worker-2", "n2"),
    ]
    for pod in pods.values():
        # The flavor's labels stay; the rack is the assignment's.
        assert pod["spec"]["nodeSelector"]["pool"] == "h100"
        assert pod["spec"]["nodeSelector"][RACK] == "r1"
        # A TAS pod: Kueue counts it in the Workload's usage, not again as non-TAS usage.
        annotations = pod["metadata"]["annotations"]
        assert annotations["kueue.x-k8s.io/podset-required-topology"] == RACK
        assert annotations["kueue.x-k8s.io/workload"] == "trainingjob-llm-abcde"
        assert not pod["spec"].get("schedulingGates")  # placed by the operator, not Kueue's ungater
    assert pods["llm-worker-0"]["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "worker"
    assert pods["llm-master-0"]["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "master"


def test_a_tas_flavor_without_a_request_marks_the_pods_unconstrained():
    manifest = tas_admitted(MASTER_ON_N1, v1beta2_assignment())
    for pod_set in manifest["spec"]["podSets"]:
        del pod_set["topologyRequest"]
    infos = admission.pod_set_infos(ObservedWorkload(manifest), FLAVORS)
    assert infos["worker"].annotations["kueue.x-k8s.io/podset-unconstrained-topology"] == "true"


def test_an_admission_without_topology_adds_no_tas_marks():
    manifest = tas_admitted(MASTER_ON_N1, v1beta2_assignment())
    for assignment in manifest["status"]["admission"]["podSetAssignments"]:
        del assignment["topologyAssignment"]
    info = admission.pod_set_infos(ObservedWorkload(manifest), FLAVORS)["worker"]
    assert info.domains == () and info.annotations == {} and info.labels == {}


def test_an_unreadable_assignment_waits_and_says_so_without_crashing():
    manifest = tas_admitted(MASTER_ON_N1, {"levels": [RACK], "domains": [{"count": 3}]})
    p = plan(topology_job("Required"), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    assert pods_of(p) == [] and p.status["phase"] == "Pending"
    created = find(p.status["conditions"], "Created")
    assert created["reason"] == "WaitingForTopologyAssignment"
    assert "unreadable topologyAssignment" in created["message"]


def test_a_delayed_topology_waits_for_its_assignment():
    manifest = tas_admitted(MASTER_ON_N1, v1beta2_assignment())
    worker = manifest["status"]["admission"]["podSetAssignments"][1]
    del worker["topologyAssignment"]
    worker["delayedTopologyRequest"] = "Pending"
    p = plan(topology_job("Required"), observed(kueue=kueue(manifest)), at(0), CONFIG, status={})
    assert pods_of(p) == []
    assert find(p.status["conditions"], "Created")["reason"] == "WaitingForTopologyAssignment"
