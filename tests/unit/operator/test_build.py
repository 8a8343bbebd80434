"""Rendered children: the pod contract, NCCL/RDMA wiring, volumes, templates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.build import podgroup, service
from torchfleet_operator.build.pods import build_pod
from torchfleet_trainer.contract import PodContract

from .builders import job

GOLDEN = Path(__file__).parent / "golden"
RDMA_SPEC = {
    "image": "registry.local/llm:1",
    "command": ["torchrun", "train.py"],
    "args": ["--lr", "3e-4"],
    "resources": {"gpus": 8, "cpu": 64, "memory": "512Gi", "shmSize": "64Gi"},
    "network": {
        "transport": "infiniband",
        "socketInterface": "eth0",
        "ibHCAs": ["mlx5_0:1", "mlx5_1:1"],
        "gidIndex": 3,
        "gpuDirectRDMALevel": "PXB",
        "rdmaResources": {"rdma/ib": 8},
        "ncclEnv": {"NCCL_DEBUG": "WARN"},
    },
    "checkpoint": {"claimTemplate": {"size": "1Ti"}, "intervalSteps": 500},
    "scheduling": {"podGroup": "Volcano", "queueName": "research", "priorityClassName": "training"},
    "worker": {
        "replicas": 3,
        "template": {
            "metadata": {"labels": {"team": "nlp"}},
            "spec": {
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "trainer",
                        "env": [
                            {"name": "NCCL_DEBUG", "value": "INFO"},
                            {"name": "HF_HOME", "value": "/cache"},
                        ],
                    },
                    {"name": "log-shipper", "image": "fluent-bit:3"},
                ],
            },
        },
    },
}


def render(spec: dict, rank: int, restart: int = 0) -> dict:
    body = job(workers=spec.get("worker", {}).get("replicas", 2), **spec)
    parsed = TrainingJob.model_validate(body)
    return build_pod("llm", "team", "uid-1", parsed.spec, rank, restart, "default/image:1")


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_rdma_worker_pod_matches_golden_yaml():
    rendered = yaml.safe_dump(render(RDMA_SPEC, rank=2, restart=1), sort_keys=True)
    golden = GOLDEN / "worker-rdma.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text(), "re-run with UPDATE_GOLDEN=1 after a deliberate change"


def test_one_process_per_pod_gets_per_process_ranks_for_plain_env_scripts():
    env = env_of(render({"command": ["python", "train.py"]}, rank=2))
    assert env["RANK"] == "2" and env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "llm-master-0.llm.team.svc"
    assert env["PET_NNODES"] == "3" and env["PET_NODE_RANK"] == "2"
    # What the trainer reads back is exactly what the operator meant.
    contract = PodContract.from_env(env)
    assert (contract.nnodes, contract.node_rank, contract.world_size) == (3, 2, 3)


def test_several_processes_per_pod_leave_ranks_to_torchrun():
    env = env_of(
        render(
            {"resources": {"gpus": 8}, "processesPerNode": "gpu", "command": ["torchrun", "t.py"]},
            rank=1,
        )
    )
    assert env["PET_NPROC_PER_NODE"] == "8"
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} & env.keys()


def test_nccl_env_resources_and_ipc_lock_follow_the_network_spec():
    pod = render(RDMA_SPEC, rank=1)
    container = pod["spec"]["containers"][0]
    env = env_of(pod)
    assert env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_NET_GDR_LEVEL"] == "PXB"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_DEBUG"] == "INFO"  # the template's own value wins over ncclEnv
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "rdma/ib": "8",
        "cpu": "64",
        "memory": "512Gi",
    }
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    tcp = render({"network": {"transport": "tcp"}}, rank=0)
    assert env_of(tcp)["NCCL_IB_DISABLE"] == "1"
    assert "securityContext" not in tcp["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("job_shm", "operator_default", "expected"),
    [
        ("2Gi", "16Gi", {"medium": "Memory", "sizeLimit": "2Gi"}),  # the job's own wins
        (None, "16Gi", {"medium": "Memory", "sizeLimit": "16Gi"}),  # else the operator's
        (None, None, {"medium": "Memory"}),  # else bounded by the pod's memory limit
    ],
)
def test_shm_size_from_job_then_operator_default(job_shm, operator_default, expected):
    resources = {"cpu": 4} | ({"shmSize": job_shm} if job_shm else {})
    parsed = TrainingJob.model_validate(job(resources=resources))
    pod = build_pod("llm", "team", "uid-1", parsed.spec, 0, 0, "img:1", operator_default)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == expected


def test_shm_checkpoint_volume_and_identity_fields():
    pod = render(RDMA_SPEC, rank=3)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert volumes["checkpoint"]["persistentVolumeClaim"]["claimName"] == "llm-checkpoint"
    assert env_of(pod)["TORCHFLEET_CHECKPOINT_DIR"] == "/checkpoints"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("llm-worker-2", "llm")
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "llm"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trainer", "log-shipper"]


@pytest.mark.parametrize(
    ("checkpoint", "template_security", "expected"),
    [
        # A provisioned volume is root-owned; the trainer image runs as uid 1000.
        (
            {"claimTemplate": {"size": "1Ti"}},
            None,
            {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"},
        ),
        (
            {"claimName": "shared"},
            {"runAsUser": 2000},
            {"runAsUser": 2000, "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"},
        ),
        ({"claimName": "shared"}, {"fsGroup": 3000}, {"fsGroup": 3000}),  # the template's choice
        (None, None, None),  # no checkpoint volume: nothing to own
    ],
)
def test_checkpoint_volume_is_writable_by_a_non_root_trainer(
    checkpoint, template_security, expected
):
    template = {"spec": {"securityContext": template_security}} if template_security else None
    spec = {
        "checkpoint": checkpoint,
        "worker": {"replicas": 1, **({"template": template} if template else {})},
    }
    pod = render({k: v for k, v in spec.items() if v is not None}, rank=1)
    assert pod["spec"].get("securityContext") == expected


def test_templates_cannot_override_what_the_gang_depends_on():
    spec = {
        "worker": {
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"torchfleet.dev/role": "master"}},
                "spec": {"restartPolicy": "Always", "hostname": "x"},
            },
        }
    }
    pod = render(spec, rank=1)
    assert pod["metadata"]["labels"]["torchfleet.dev/role"] == "worker"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["hostname"] == "llm-worker-0"


def test_headless_service_publishes_not_ready_addresses():
    svc = service.headless_service("llm", "team", "uid-1")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(
    ("kind", "api_version"),
    [
        ("Coscheduling", "scheduling.x-k8s.io/v1alpha1"),
        ("Volcano", "scheduling.volcano.sh/v1beta1"),
    ],
)
def test_pod_group_asks_for_the_whole_gang(kind, api_version):
    parsed = TrainingJob.model_validate(job(workers=7, scheduling={"podGroup": kind}))
    group = podgroup.pod_group("llm", "team", "uid-1", parsed.spec)
    assert group is not None
    assert group["apiVersion"] == api_version and group["spec"]["minMember"] == 8


@pytest.mark.parametrize(
    ("mode", "field"),
    [
        ("Required", "requiredDuringSchedulingIgnoredDuringExecution"),
        ("Preferred", "preferredDuringSchedulingIgnoredDuringExecution"),
    ],
)
def test_topology_packs_the_gang_and_keeps_the_templates_affinity(mode, field):
    node_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    }
    pod = render(
        {
            "scheduling": {"topology": {"key": "topology.kubernetes.io/zone", "mode": mode}},
            "worker": {"replicas": 2, "template": {"spec": {"affinity": node_affinity}}},
        },
        rank=1,
    )
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node_affinity["nodeAffinity"]
    (term,) = affinity["podAffinity"][field]
    term = term.get("podAffinityTerm", term)
    assert term == {
        "labelSelector": {"matchLabels": {"torchfleet.dev/job-name": "llm"}},
        "topologyKey": "topology.kubernetes.io/zone",
    }
