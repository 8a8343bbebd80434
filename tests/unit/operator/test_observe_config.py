"""Pod/node summaries from real-shaped manifests, and the operator's tunables."""

from __future__ import annotations

import pytest

from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.observed import ObservedNode, ObservedPod

LABELS = {
    "torchfleet.dev/role": "worker",
    "torchfleet.dev/node-rank": "2",
    "torchfleet.dev/restart": "1",
    "torchfleet.dev/job-name": "llm",
}


def manifest(status: dict, **meta) -> dict:
    return {
        "metadata": {"name": "llm-worker-1", "uid": "u", "labels": LABELS, **meta},
        "spec": {"nodeName": "n1"},
        "status": status,
    }


def test_failed_pod_reports_its_exit_code_and_reason():
    pod = ObservedPod.from_manifest(
        manifest(
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                    }
                ],
            }
        )
    )
    assert pod is not None
    assert (pod.role, pod.node_rank, pod.restart) == ("worker", 2, 1)
    assert (pod.exit_code, pod.reason, pod.disrupted) == (137, "OOMKilled", False)


def test_evicted_and_preempted_pods_are_disruptions():
    evicted = ObservedPod.from_manifest(
        manifest({"phase": "Failed", "reason": "Evicted", "message": "low on memory"})
    )
    preempted = ObservedPod.from_manifest(
        manifest(
            {
                "phase": "Running",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                    }
                ],
            }
        )
    )
    assert evicted is not None and evicted.disrupted and evicted.reason == "Evicted"
    assert preempted is not None and preempted.disrupted
    assert preempted.reason == "PreemptionByScheduler"


def test_pods_without_torchfleet_labels_are_ignored():
    assert ObservedPod.from_manifest({"metadata": {"name": "x", "labels": {}}}) is None


def test_node_readiness_and_transition_time():
    node = ObservedNode.from_manifest(
        {
            "metadata": {"name": "n1"},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            },
        }
    )
    assert not node.ready and node.since is not None and node.since.year == 2026


def test_config_reads_env_and_names_bad_values():
    config = OperatorConfig.from_env(
        {"TORCHFLEET_OPERATOR_RESTART_BACKOFF_SECONDS": "0.5", "TORCHFLEET_OPERATOR_WORKERS": "3"}
    )
    assert config.restart_backoff_seconds == 0.5 and config.workers == 3
    with pytest.raises(ValueError, match="TORCHFLEET_OPERATOR_WORKERS"):
        OperatorConfig.from_env({"TORCHFLEET_OPERATOR_WORKERS": "many"})
    with pytest.raises(ValueError, match="NODE_LOST_GRACE_SECONDS"):
        OperatorConfig.from_env({"TORCHFLEET_OPERATOR_NODE_LOST_GRACE_SECONDS": "-1"})
