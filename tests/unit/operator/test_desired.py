"""Rendered children: the pod contract, NCCL/RDMA wiring, volumes, templates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from torchfleet_contract.pod import PodContract
from torchfleet_contract.trainer_config import load_config
from torchfleet_operator.api.v1alpha1 import TrainingJob
from torchfleet_operator.desired import podgroup, security, service
from torchfleet_operator.desired.pods import build_pod

from .builders import job, literal_env

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
    "runPolicy": {"terminationGracePeriodSeconds": 300},
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
    return literal_env(pod)


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
    assert (contract.nodes, contract.node_rank, contract.world_size) == (3, 2, 3)


@pytest.mark.parametrize(
    ("job_checkpoint", "trainer", "expected"),
    [
        # The job's cadence wins over the trainer config's, field by field.
        (
            {"intervalSteps": 20, "keepLast": 2},
            {"checkpoint": {"interval": 50, "keepLast": 5, "asyncSave": True}},
            (20, 2, True),
        ),
        ({"intervalSteps": 20}, {"checkpoint": {"interval": 50, "keepLast": 5}}, (20, 5, False)),
        # Without a trainer config the job's cadence still reaches the trainer.
        ({"intervalSteps": 30, "keepLast": 4}, None, (30, 4, False)),
        # Without a cadence on the job the trainer config's stands.
        ({}, {"checkpoint": {"interval": 50}}, (50, 3, False)),
    ],
)
def test_rendered_env_gives_the_trainer_the_jobs_checkpoint_cadence(
    job_checkpoint, trainer, expected
):
    spec = {"worker": {"replicas": 1}, "checkpoint": {"claimName": "ckpt", **job_checkpoint}}
    if trainer is not None:
        spec["trainer"] = trainer
    env = env_of(render(spec, rank=1))
    pod = PodContract.from_env(env)
    assert pod.checkpoint_dir == "/checkpoints"
    # What a user's script reads: the job's own values, as the job set them.
    assert (pod.checkpoint_interval, pod.checkpoint_keep) == (
        job_checkpoint.get("intervalSteps"),
        job_checkpoint.get("keepLast"),
    )
    # What torchfleet-train runs with: the config the operator rendered, read back.
    config = load_config(env=env)
    checkpoint = config.checkpoint
    assert (checkpoint.interval, checkpoint.keep_last, checkpoint.async_save) == expected
    # Command-line overrides (spec.args) still win over both.
    assert load_config(overrides=["checkpoint.interval=7"], env=env).checkpoint.interval == 7


def test_a_users_command_gets_the_cadence_but_no_trainer_config():
    cadence = {"claimName": "ckpt", "intervalSteps": 25, "keepLast": 2}
    env = env_of(render({"command": ["python", "t.py"], "checkpoint": cadence}, rank=0))
    pod = PodContract.from_env(env)
    assert (pod.checkpoint_interval, pod.checkpoint_keep, pod.train_config) == (25, 2, None)


GRACE_CASES = {
    # id: (spec, the master's grace, a worker's grace)
    "default covers a save of the default model": ({}, 30, 30),
    "the job's field reaches every pod": (
        {"runPolicy": {"terminationGracePeriodSeconds": 120}},
        120,
        120,
    ),
    "a role template sets its own pods' grace": (
        {"master": {"template": {"spec": {"terminationGracePeriodSeconds": 600}}}},
        600,
        30,
    ),
    "a template agreeing with the job's field": (
        {
            "runPolicy": {"terminationGracePeriodSeconds": 600},
            "worker": {
                "replicas": 2,
                "template": {"spec": {"terminationGracePeriodSeconds": 600}},
            },
        },
        600,
        600,
    ),
}


@pytest.mark.parametrize(("spec", "master", "worker"), GRACE_CASES.values(), ids=GRACE_CASES)
def test_termination_grace_of_every_pod(spec: dict, master: int, worker: int):
    # A contradicting template is refused at apply (tests/unit/api/cases.py).
    graces = [render(spec, rank)["spec"]["terminationGracePeriodSeconds"] for rank in (0, 1, 2)]
    assert graces == [master, worker, worker]


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
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_NET_GDR_LEVEL"] == "PXB"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_DEBUG"] == "INFO"  # the template's own value wins over ncclEnv
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "rdma/ib": "8",
        "cpu": "64",
        "memory": "512Gi",
    }
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    tcp = render({"network": {"transport": "tcp"}}, rank=0)
    assert env_of(tcp)["NCCL_IB_DISABLE"] == "1"
    assert "add" not in tcp["spec"]["containers"][0]["securityContext"]["capabilities"]


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    # Not a Pod Security requirement: the scanners' (checkov CKV_K8S_22).
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # The operator's trainer image runs as uid 1000: the pod is restricted as it is.
        ({}, RESTRICTED_CONTAINER | {"runAsNonRoot": True}),
        ({"network": {"transport": "tcp"}}, RESTRICTED_CONTAINER | {"runAsNonRoot": True}),
        # An image of the user's own: only its author knows its user.
        ({"image": "pytorch/pytorch:2"}, RESTRICTED_CONTAINER),
        (
            {
                "worker": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "trainer", "image": "x:1"}]}},
                }
            },
            RESTRICTED_CONTAINER,
        ),
        # RDMA: restricted plus exactly IPC_LOCK.
        (
            {"network": {"transport": "roce", "rdmaResources": {"rdma/roce": 1}}},
            RESTRICTED_CONTAINER
            | {"runAsNonRoot": True, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
        ),
    ],
    ids=["auto", "tcp", "own-image", "template-image", "rdma"],
)
def test_trainer_container_asks_for_no_more_than_the_job_needs(spec, expected):
    pod = render({"worker": {"replicas": 1}} | spec, rank=1)
    assert pod["spec"]["containers"][0]["securityContext"] == expected


def test_template_resources_merge_per_key():
    template = {
        "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "100Gi"}}}]}
    }
    pod = render(
        {
            "resources": {"gpus": 8, "memory": "64Gi"},
            "network": {"transport": "infiniband", "rdmaResources": {"rdma/ib": 4}},
            "worker": {"replicas": 1, "template": template},
        },
        rank=1,
    )
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "4", "memory": "100Gi"}
    assert (
        resources["requests"]["nvidia.com/gpu"] == "8" and resources["requests"]["rdma/ib"] == "4"
    )


@pytest.mark.parametrize(
    ("template_security", "expected_capabilities", "expected_extra"),
    [
        # Saying nothing about capabilities keeps what RDMA needs.
        (
            {"runAsUser": 0, "runAsNonRoot": False},
            {"drop": ["ALL"], "add": ["IPC_LOCK"]},
            {"runAsUser": 0, "runAsNonRoot": False},
        ),
        # Saying otherwise wins, key by key (a list is the template's as written).
        (
            {"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}},
            {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_PTRACE"]},
            {},
        ),
        ({"capabilities": {"drop": []}}, {"drop": [], "add": ["IPC_LOCK"]}, {}),
    ],
)
def test_template_security_context_keeps_what_rdma_needs_unless_it_says_otherwise(
    template_security, expected_capabilities, expected_extra
):
    template = {"spec": {"containers": [{"name": "trainer", "securityContext": template_security}]}}
    pod = render(
        {
            "network": {"transport": "infiniband", "rdmaResources": {"rdma/ib": 1}},
            "worker": {"replicas": 1, "template": template},
        },
        rank=1,
    )
    context = pod["spec"]["containers"][0]["securityContext"]
    assert context["capabilities"] == expected_capabilities
    assert context["allowPrivilegeEscalation"] is False
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for key, value in expected_extra.items():
        assert context[key] == value


@pytest.mark.parametrize(
    ("socket_interface", "gloo"),
    [
        ("eth0", "eth0"),
        ("eth0,eth1", "eth0,eth1"),
        ("^lo,docker", None),  # NCCL's exclusion: gloo would look for a device named "^lo"
        ("=ib0", None),  # NCCL's exact match
    ],
)
def test_gloo_gets_only_a_plain_list_of_interface_names(socket_interface, gloo):
    env = env_of(render({"network": {"socketInterface": socket_interface}}, rank=1))
    assert env["NCCL_SOCKET_IFNAME"] == socket_interface
    assert env.get("GLOO_SOCKET_IFNAME") == gloo


@pytest.mark.parametrize(
    ("transport", "nccl_net"), [("auto", None), ("tcp", None), ("infiniband", "IB"), ("roce", "IB")]
)
def test_rdma_transports_make_nccl_fail_fast_instead_of_using_sockets(transport, nccl_net):
    env = env_of(render({"network": {"transport": transport}}, rank=0))
    assert env.get("NCCL_NET") == nccl_net


@pytest.mark.parametrize(
    ("match", "expected"),
    [(None, "=mlx5_1,mlx5_2:1"), ("Exact", "=mlx5_1,mlx5_2:1"), ("Prefix", "mlx5_1,mlx5_2:1")],
)
def test_ib_hcas_match_exactly_unless_asked_for_prefixes(match, expected):
    network = {"transport": "infiniband", "ibHCAs": ["mlx5_1", "mlx5_2:1"]}
    if match:
        network["ibHCAMatch"] = match
    assert env_of(render({"network": network}, rank=0))["NCCL_IB_HCA"] == expected


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
    # Kueue admits the job as one Workload: its pods carry no queue of their own.
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trainer", "log-shipper"]


# Every pod's own securityContext has it, so a template's sidecars do too.
POD_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(
    ("checkpoint", "template_security", "expected"),
    [
        # A provisioned volume is root-owned; the trainer image runs as uid 1000.
        (
            {"claimTemplate": {"size": "1Ti"}},
            None,
            {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"} | POD_SECCOMP,
        ),
        (
            {"claimName": "shared"},
            {"runAsUser": 2000},
            {"runAsUser": 2000, "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}
            | POD_SECCOMP,
        ),
        # The template's choice.
        ({"claimName": "shared"}, {"fsGroup": 3000}, {"fsGroup": 3000} | POD_SECCOMP),
        (None, None, POD_SECCOMP),  # no checkpoint volume: nothing to own
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


def trainer_template(**fields) -> dict:
    return {"spec": {"containers": [{"name": "trainer", **fields}]}}


@pytest.mark.parametrize(
    ("template", "mounted"),
    [(None, False), ({"spec": {"automountServiceAccountToken": True}}, True)],
    ids=["default", "template-asks"],
)
def test_training_pods_mount_no_service_account_token_unless_the_template_asks(template, mounted):
    worker = {"replicas": 1, **({"template": template} if template else {})}
    pod = render({"worker": worker}, rank=1)
    assert pod["spec"]["automountServiceAccountToken"] is mounted


def scratch_of(pod: dict) -> tuple[list, list]:
    """The trainer's mounts at /tmp and the pod's volumes they name."""
    mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/tmp"]
    named = {m["name"] for m in mounts}
    return mounts, [v for v in pod["spec"]["volumes"] if v["name"] in named]


@pytest.mark.parametrize(
    ("spec", "home"),
    [({}, "/tmp"), ({"image": "pytorch/pytorch:2"}, None)],
    ids=["trainer-image", "own-image"],
)
def test_a_read_only_root_gets_a_writable_tmp_and_the_home_caches_there(spec, home):
    pod = render({"worker": {"replicas": 1}} | spec, rank=1)
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    mounts, volumes = scratch_of(pod)
    assert mounts == [{"name": "trainer-tmp", "mountPath": "/tmp"}]
    assert volumes == [{"name": "trainer-tmp", "emptyDir": {}}]
    env = env_of(pod)
    assert env["TRITON_CACHE_DIR"] == "/tmp/.triton/cache"
    assert env["TORCH_EXTENSIONS_DIR"] == "/tmp/.cache/torch_extensions"
    # HOME moves only for the operator's image; an image of one's own keeps its home.
    assert env.get("HOME") == home


def test_a_template_that_wants_a_writable_root_gets_no_scratch():
    template = trainer_template(securityContext={"readOnlyRootFilesystem": False})
    pod = render({"worker": {"replicas": 1, "template": template}}, rank=1)
    assert scratch_of(pod) == ([], [])
    assert "HOME" not in env_of(pod) and "TRITON_CACHE_DIR" not in env_of(pod)
    assert "trainer-tmp" not in {v["name"] for v in pod["spec"]["volumes"]}


def test_a_templates_own_tmp_and_home_win_over_the_scratch():
    template = trainer_template(
        volumeMounts=[{"name": "fast", "mountPath": "/tmp"}],
        env=[{"name": "HOME", "value": "/home/me"}],
    )
    template["spec"]["volumes"] = [{"name": "fast", "emptyDir": {"medium": "Memory"}}]
    pod = render({"worker": {"replicas": 1, "template": template}}, rank=1)
    mounts, volumes = scratch_of(pod)
    assert mounts == [{"name": "fast", "mountPath": "/tmp"}]
    assert volumes == [{"name": "fast", "emptyDir": {"medium": "Memory"}}]
    assert "trainer-tmp" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert env_of(pod)["HOME"] == "/home/me"
    assert env_of(pod)["TRITON_CACHE_DIR"] == "/tmp/.triton/cache"


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


# The API server's words for a Pod Security refusal (pod-security-admission's format).
BASELINE_REFUSAL = (
    'pods "llm-worker-0" is forbidden: violates PodSecurity "baseline:latest": non-default '
    'capabilities (container "trainer" must not include "IPC_LOCK" in '
    "securityContext.capabilities.add)"
)


def test_a_pod_security_refusal_names_the_level_and_keeps_the_servers_words():
    text = security.describe_refusal(BASELINE_REFUSAL)
    assert text is not None and "level 'baseline'" in text and BASELINE_REFUSAL in text
    assert security.describe_refusal('pods "x" is forbidden: exceeded quota: gpus') is None


def test_pod_group_asks_for_the_gangs_summed_requests():
    spec = {
        "resources": {"gpus": 8, "cpu": "7500m", "memory": "512Gi"},
        "network": {"transport": "infiniband", "rdmaResources": {"rdma/ib": 8}},
        "scheduling": {"podGroup": "Volcano", "queueName": "research"},
        "master": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "logs", "resources": {"requests": {"cpu": "500m"}}},
                    ]
                }
            }
        },
        "worker": {
            "replicas": 2,
            "template": {
                "spec": {
                    # The template's own trainer resources win, as on the pod.
                    "containers": [
                        {
                            "name": "trainer",
                            "resources": {"limits": {"nvidia.com/gpu": 4, "memory": "256Gi"}},
                        }
                    ],
                    "initContainers": [{"name": "warm", "resources": {"requests": {"cpu": 2}}}],
                }
            },
        },
    }
    parsed = TrainingJob.model_validate(job(**spec))
    group = podgroup.pod_group("llm", "team", "uid-1", parsed.spec)
    assert group is not None
    assert group["spec"]["minResources"] == {
        "cpu": "12",  # master 7.5 + 0.5 sidecar; each worker max(0, init 2)
        "memory": str(512 * 2**30 + 2 * 256 * 2**30),
        "nvidia.com/gpu": "16",
        "rdma/ib": "8",  # the workers' template replaces the trainer's limits
    }
    assert group["spec"]["minMember"] == 3 and group["spec"]["queue"] == "research"
    # The same sums as the pods the scheduler will see.
    pods = [build_pod("llm", "team", "uid-1", parsed.spec, r, 0, "img") for r in range(3)]
    gpus = sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for p in pods
        for c in p["spec"]["containers"]
    )
    assert gpus == 16


@pytest.mark.parametrize(("given", "expected"), [(None, 300), (45, 45)])
def test_coscheduling_group_has_a_schedule_timeout(given, expected):
    scheduling = {"podGroup": "Coscheduling", "scheduleTimeoutSeconds": given}
    parsed = TrainingJob.model_validate(
        job(scheduling={k: v for k, v in scheduling.items() if v is not None})
    )
    group = podgroup.pod_group("llm", "team", "uid-1", parsed.spec)
    assert group is not None and group["spec"]["scheduleTimeoutSeconds"] == expected


def test_a_cpu_only_gang_asks_for_no_resources_it_does_not_name():
    parsed = TrainingJob.model_validate(job(workers=1, scheduling={"podGroup": "Volcano"}))
    group = podgroup.pod_group("llm", "team", "uid-1", parsed.spec)
    assert group is not None and "minResources" not in group["spec"]


@pytest.mark.parametrize(
    ("quantity", "value"),
    [("8", 8), ("7500m", 7.5), ("64Gi", 64 * 2**30), ("1e3", 1000), ("1.5k", 1500), (2, 2)],
)
def test_quantities_are_read_exactly(quantity, value):
    assert podgroup.parse_quantity(quantity) == value


@pytest.mark.parametrize(
    ("kind", "scheduler"),
    [("Volcano", "volcano"), ("Coscheduling", None)],
)
def test_gang_pods_name_their_scheduler_and_group(kind, scheduler):
    pod = render({"scheduling": {"podGroup": kind}}, rank=0)
    assert pod["spec"].get("schedulerName") == scheduler
    if kind == "Volcano":
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "llm"
    else:
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "llm"


# ---- elastic jobs ------------------------------------------------------------------

ELASTIC = {"elastic": {"minNodes": 2, "maxNodes": 4, "maxRestarts": 5}, "worker": {"replicas": 3}}
MASTER_DNS = "llm-master-0.llm.team.svc"


@pytest.mark.parametrize(
    ("rank", "restart", "is_host", "local_addr", "port"),
    [
        (0, 0, "1", MASTER_DNS, 29500),
        (1, 0, "0", "llm-worker-0.llm.team.svc", 29500),
        (3, 0, "0", "llm-worker-2.llm.team.svc", 29500),
        # A gang restart: a new rendezvous id and port, so an older gang's agent cannot join.
        (2, 3, "0", "llm-worker-1.llm.team.svc", 29503),
    ],
)
def test_an_elastic_pod_gets_torchruns_rendezvous_and_no_rank(
    rank, restart, is_host, local_addr, port
):
    env = env_of(render(ELASTIC, rank=rank, restart=restart))
    assert env["PET_NNODES"] == "2:4"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"{MASTER_DNS}:{port}"
    assert env["PET_RDZV_ID"] == f"uid-1-{restart}"  # the job's, for this gang generation
    assert env["PET_MAX_RESTARTS"] == "5"
    assert env["PET_RDZV_CONF"] == f"is_host={is_host}"
    assert env["PET_LOCAL_ADDR"] == local_addr
    # Ranks come from each rendezvous round, never from the pod.
    assert not {"PET_NODE_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK"} & set(env)
    # What the trainer's launcher reads back.
    elastic = PodContract.from_env(env).elastic
    assert elastic is not None and elastic.node_counts == range(2, 5)
    assert (elastic.endpoint, elastic.local_addr) == (f"{MASTER_DNS}:{port}", local_addr)


def test_elastic_workers_differ_only_in_their_names():
    """A recreated worker's pod is the same whichever survivors remain: no rank in it."""
    first, last = (env_of(render(ELASTIC, rank=rank)) for rank in (1, 3))
    differing = {name for name in first.keys() | last.keys() if first.get(name) != last.get(name)}
    assert differing == {"PET_LOCAL_ADDR"}


def test_a_fixed_gang_gets_no_elastic_variables():
    env = env_of(render({"worker": {"replicas": 3}}, rank=1))
    assert env["PET_NODE_RANK"] == "1" and env["PET_RDZV_ID"] == "llm-gen0"
    assert not {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_CONF", "PET_LOCAL_ADDR"} & set(
        env
    )


@pytest.mark.parametrize(
    ("elastic", "members", "gpus"),
    [
        (None, 4, "32"),
        ({"minNodes": 2, "maxNodes": 4}, 2, "16"),
        ({"minNodes": 4, "maxNodes": 6}, 4, "32"),
    ],
)
def test_an_elastic_pod_group_asks_for_min_nodes(elastic, members, gpus):
    spec = {"resources": {"gpus": 8}, "scheduling": {"podGroup": "Coscheduling"}}
    if elastic is not None:
        spec["elastic"] = elastic
    group = podgroup.pod_group(
        "llm", "team", "uid-1", TrainingJob.model_validate(job(workers=3, **spec)).spec
    )
    assert group is not None
    assert group["spec"]["minMember"] == members
    assert group["spec"]["minResources"]["nvidia.com/gpu"] == gpus
