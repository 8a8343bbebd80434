"""The pod `torchfleet logs JOB --generation G` starts to read a kept log:
the job's claim read-only where its pods mount it, the one file's path, the
master's placement, restricted Pod Security; and a clear refusal for a job
that keeps no logs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.builders import job
from torchfleet_cli.kept_logs import NoKeptLogs, reader_pod

CLAIM_TEMPLATE = {"claimTemplate": {"size": "10Gi"}, "mountPath": "/ckpt"}
PLACED = {
    "template": {
        "spec": {
            "nodeSelector": {"pool": "a100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        }
    }
}


def _cat(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return container


@pytest.mark.parametrize(
    ("checkpoint", "claim"),
    [
        (CLAIM_TEMPLATE, "llm-checkpoint"),
        ({"claimName": "team-ckpt", "mountPath": "/ckpt"}, "team-ckpt"),
    ],
)
def test_the_reader_mounts_the_jobs_claim_read_only_and_cats_one_file(
    checkpoint: dict[str, Any], claim: str
) -> None:
    pod = reader_pod(job(checkpoint=checkpoint, image="reg/t:1", master=PLACED), 3, 1, 5)
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    cat = _cat(pod)
    assert cat["command"] == ["cat", "/ckpt/logs/gen-3/round-1/rank-5.log"]
    assert cat["volumeMounts"] == [{"name": "checkpoint", "mountPath": "/ckpt", "readOnly": True}]
    assert cat["image"] == "reg/t:1"
    assert pod["spec"]["nodeSelector"] == {"pool": "a100"}  # where the job's claim is reached
    assert pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert cat["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["name"].startswith("llm-logs-")


def test_a_checkpoint_from_the_recorded_runtime_counts() -> None:
    body = job(runtimeRef={"name": "gpu"})
    body["status"] = {
        "runtime": {
            "kind": "ClusterTrainingRuntime",
            "name": "gpu",
            "generation": 1,
            "hash": "0123456789abcdef",
            "spec": {"checkpoint": CLAIM_TEMPLATE},
        }
    }
    assert _cat(reader_pod(body, 0, 0, 0))["command"] == [
        "cat",
        "/ckpt/logs/gen-0/round-0/rank-0.log",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        {"command": ["torchrun", "train.py"], "checkpoint": CLAIM_TEMPLATE},  # a command of its own
        {},  # no checkpoint volume
    ],
    ids=["own-command", "no-checkpoint"],
)
def test_a_job_that_keeps_no_logs_is_refused_saying_why(spec: dict[str, Any]) -> None:
    with pytest.raises(NoKeptLogs, match="llm keeps no logs: only torchfleet-train keeps them"):
        reader_pod(job(**spec), 0, 0, 0)
