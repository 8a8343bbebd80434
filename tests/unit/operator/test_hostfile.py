"""The gang's hostfile (desired/hostfile.py): its lines and order for fixed,
elastic (resized) and restarted gangs, and how each pod gets it. The script the
init container runs is run for real in tests/e2e/test_deepspeed.py."""

from __future__ import annotations

from typing import Any

import pytest

from torchfleet_contract import pod as contract
from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired import hostfile
from torchfleet_operator.desired.pods import build_pod

from .builders import job, literal_env

DEEPSPEED = [
    "deepspeed",
    "--hostfile=/etc/deepspeed/hostfile",
    "--no_ssh",
    "--node_rank=$(NODE_RANK)",
    "train.py",
]


def parse(workers: int = 2, **spec: Any) -> Any:
    return TrainingJob.model_validate(job(workers=workers, **spec)).spec


def render(spec: Any, rank: int, restart: int = 0) -> dict[str, Any]:
    return build_pod("llm", "team", "uid-1", spec, rank, restart, "default/image:1")


def writer(pod: dict[str, Any]) -> dict[str, Any]:
    inits = pod["spec"].get("initContainers") or []
    return next(c for c in inits if c["name"] == hostfile.INIT_CONTAINER)


def written_by(pod: dict[str, Any]) -> list[str]:
    """What the init container's script writes, read from its arguments: the
    file, the count, the slots, the master, and a worker's prefix and suffix."""
    path, count, slots, master, prefix, suffix = writer(pod)["command"][4:]
    assert path == contract.HOSTFILE_PATH
    hosts = [master, *(f"{prefix}{i}{suffix}" for i in range(int(count) - 1))]
    return [f"{host} slots={slots}" for host in hosts]


def test_a_fixed_gang_lists_its_pods_in_node_rank_order():
    spec = parse(workers=3, command=DEEPSPEED, processesPerNode=8)
    expected = [
        "llm-master-0.llm.team.svc slots=8",
        "llm-worker-0.llm.team.svc slots=8",
        "llm-worker-1.llm.team.svc slots=8",
        "llm-worker-2.llm.team.svc slots=8",
    ]
    assert hostfile.lines("llm", "team", spec) == expected
    # Every pod writes the same file: --node_rank indexes it, so it must not differ.
    for rank in range(4):
        assert written_by(render(spec, rank)) == expected


def test_slots_follow_processes_per_node_one_per_gpu():
    spec = parse(workers=1, command=DEEPSPEED, processesPerNode="gpu", resources={"gpus": 4})
    assert hostfile.lines("llm", "team", spec) == [
        "llm-master-0.llm.team.svc slots=4",
        "llm-worker-0.llm.team.svc slots=4",
    ]


def test_a_restarted_gang_writes_the_same_hostfile_on_a_new_port():
    spec = parse(workers=1, command=DEEPSPEED)
    first, restarted = render(spec, 1, restart=0), render(spec, 1, restart=5)
    assert writer(first) == writer(restarted)
    ports = [literal_env(p)["MASTER_PORT"] for p in (first, restarted)]
    # Why a DeepSpeed command passes --master_port=$(MASTER_PORT): the port moves.
    assert ports == ["29500", "29505"]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_an_elastic_gang_lists_every_pod_it_may_have_at_any_size(workers):
    """A resize keeps the surviving pods: their files must stay right, so the
    file lists maxNodes pods whatever worker.replicas is now."""
    elastic = {"minNodes": 2, "maxNodes": 4}
    spec = parse(workers=workers, command=["torchrun", "train.py"], elastic=elastic)
    expected = [
        "llm-master-0.llm.team.svc slots=1",
        "llm-worker-0.llm.team.svc slots=1",
        "llm-worker-1.llm.team.svc slots=1",
        "llm-worker-2.llm.team.svc slots=1",
    ]
    assert hostfile.lines("llm", "team", spec) == expected
    for rank in range(1 + workers):
        assert written_by(render(spec, rank)) == expected


def test_the_trainer_finds_the_file_where_the_variable_says():
    pod = render(parse(command=DEEPSPEED), 0)
    trainer = pod["spec"]["containers"][0]
    env = literal_env(pod)
    assert env[contract.HOSTFILE] == contract.HOSTFILE_PATH == "/etc/deepspeed/hostfile"
    assert {"name": "hostfile", "mountPath": "/etc/deepspeed"} in trainer["volumeMounts"]
    assert writer(pod)["volumeMounts"] == [{"name": "hostfile", "mountPath": "/etc/deepspeed"}]
    assert {"name": "hostfile", "emptyDir": {}} in pod["spec"]["volumes"]


def test_torchfleet_train_jobs_get_no_hostfile():
    pod = render(parse(), 0)
    assert "initContainers" not in pod["spec"]
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert contract.HOSTFILE not in env
    assert all(v["name"] != hostfile.VOLUME for v in pod["spec"]["volumes"])


def test_the_writer_runs_as_the_trainer_without_its_devices_or_capabilities():
    template = {
        "spec": {
            "containers": [
                {"name": "trainer", "image": "mine:1", "securityContext": {"runAsUser": 1001}}
            ]
        }
    }
    spec = parse(
        workers=1,
        command=DEEPSPEED,
        resources={"gpus": 8, "cpu": 16, "memory": "64Gi"},
        network={"transport": "infiniband", "rdmaResources": {"rdma/ib": 1}},
        worker={"replicas": 1, "template": template},
    )
    pod = render(spec, 1)
    trainer, init = pod["spec"]["containers"][0], writer(pod)
    assert init["image"] == trainer["image"] == "mine:1"
    assert trainer["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"], "drop": ["ALL"]}
    assert init["securityContext"] == {
        **trainer["securityContext"],
        "runAsUser": 1001,
        "capabilities": {"drop": ["ALL"]},
    }
    # The pod's requests are the maximum of an init container's and the sum of
    # the others': copying CPU and memory adds nothing, GPUs would hold devices.
    assert init["resources"] == {
        "limits": {"cpu": "16", "memory": "64Gi"},
        "requests": {"cpu": "16", "memory": "64Gi"},
    }


def test_the_writer_comes_after_the_templates_init_containers():
    sidecar = {"name": "log-shipper", "image": "busybox", "restartPolicy": "Always"}
    template = {"spec": {"initContainers": [sidecar]}}
    spec = parse(workers=1, command=DEEPSPEED, worker={"replicas": 1, "template": template})
    inits = render(spec, 1)["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["log-shipper", "hostfile"]


OWN_MOUNT = {
    "volumes": [{"name": "mine", "configMap": {"name": "hosts"}}],
    "containers": [
        {"name": "trainer", "volumeMounts": [{"name": "mine", "mountPath": "/etc/deepspeed"}]}
    ],
}
OWN_WRITER = {"initContainers": [{"name": "hostfile", "image": "busybox", "command": ["true"]}]}


@pytest.mark.parametrize(
    ("template_spec", "writers"),
    [(OWN_MOUNT, []), (OWN_WRITER, ["busybox"])],
    ids=["own-mount", "own-writer"],
)
def test_a_template_that_provides_the_file_keeps_it(template_spec, writers):
    template = {"spec": template_spec}
    spec = parse(workers=1, command=DEEPSPEED, worker={"replicas": 1, "template": template})
    inits = render(spec, 1)["spec"].get("initContainers") or []
    assert [c["image"] for c in inits if c["name"] == "hostfile"] == writers
