"""Manifest builders and the table of invalid TrainingJobs, shared by the unit
tests (the models) and the cluster tests (the real API server): both must
reject every case and name the same field."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api import API_VERSION, KIND

Manifest = dict[str, Any]


def job(name: str = "tj-case", spec: Manifest | None = None) -> Manifest:
    """A minimal valid TrainingJob, with ``spec`` merged in."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": copy.deepcopy(spec) if spec else {},
    }


def nested(path: str, value: Any) -> Manifest:
    """``nested("a.b", 1)`` is ``{"a": {"b": 1}}``."""
    *parents, leaf = path.split(".")
    result: Manifest = {leaf: value}
    for parent in reversed(parents):
        result = {parent: result}
    return result


def merge(*parts: Manifest) -> Manifest:
    """Deep-merges spec fragments, later ones winning."""
    result: Manifest = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = merge(result[key], value)
            else:
                result[key] = copy.deepcopy(value)
    return result


@dataclass(frozen=True)
class Invalid:
    """A spec that must be rejected, and the field the error must name."""

    id: str
    spec: Manifest
    field: str
    name: str = "tj-case"
    # Words both sides' messages must contain where the field alone is vague.
    says: str = ""

    def manifest(self) -> Manifest:
        return job(self.name, self.spec)


def _case(id: str, field: str, *parts: Manifest, name: str = "tj-case", says: str = "") -> Invalid:
    return Invalid(id=id, spec=merge(*parts), field=field, name=name, says=says)


TWO_GPUS = nested("resources.gpus", 2)
CLAIM = {"claimTemplate": {"size": "10Gi"}}


def trainer_container(**fields: Any) -> Manifest:
    """A worker template whose trainer container has ``fields``."""
    return nested("worker.template.spec.containers", [{"name": "trainer", **fields}])


# A template using much of PodSpec: both the models and the API server accept it.
RICH_POD_SPEC: Manifest = {
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    },
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "code", "configMap": {"name": "code", "defaultMode": 0o755}},
        {
            "name": "scratch",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Ti"}},
                    },
                }
            },
        },
    ],
    "containers": [
        {
            "name": "trainer",
            "resources": {"limits": {"memory": "100Gi", "cpu": 8, "example.com/fpga": 1}},
            "env": [
                {"name": "HF_HOME", "value": "/cache"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ],
            "ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}],
            "readinessProbe": {"httpGet": {"port": "metrics", "path": "/metrics"}},
            "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["SYS_PTRACE"]}},
        },
        {"name": "log-shipper", "image": "fluent-bit:3", "env": [{"name": "LOG_RANK_X"}]},
    ],
    "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
}

TEMPLATE = "spec.worker.template.spec"
TRAINER = f"{TEMPLATE}.containers[0]"

# Pod templates: the API server's own PodSpec schema, and the pod contract's env names.
TEMPLATE_CASES: tuple[Invalid, ...] = (
    _case(
        "template-cpu-not-quantity",
        f"{TRAINER}.resources.limits.cpu",
        trainer_container(resources={"limits": {"cpu": "lots"}}),
    ),
    _case("template-ports-string", f"{TRAINER}.ports", trainer_container(ports="many")),
    _case(
        "template-port-without-number",
        f"{TRAINER}.ports[0].containerPort",
        trainer_container(ports=[{"name": "http"}]),
    ),
    _case(
        "template-container-without-name",
        "spec.master.template.spec.containers[0].name",
        nested("master.template.spec.containers", [{"image": "sidecar:1"}]),
    ),
    _case(
        # The API server refuses them on pod creation: refused at apply instead.
        "template-ephemeral-containers",
        f"{TEMPLATE}.ephemeralContainers",
        nested("worker.template.spec.ephemeralContainers", [{"name": "debug", "image": "b"}]),
        says="at most 0 items",
    ),
    _case(
        "template-unknown-field",
        f"{TEMPLATE}.nodeSelectorr",
        nested("worker.template.spec.nodeSelectorr", {"gpu": "h100"}),
    ),
    _case(
        "template-tolerations-object",
        f"{TEMPLATE}.tolerations",
        nested("worker.template.spec.tolerations", {"key": "gpu"}),
    ),
    _case(
        "template-duplicate-containers",
        f"{TEMPLATE}.containers[1]",
        nested("worker.template.spec.containers", [{"name": "log"}, {"name": "log"}]),
    ),
    _case(
        # protocol defaults to TCP, so these are the same port.
        "template-duplicate-port",
        f"{TRAINER}.ports[1]",
        trainer_container(ports=[{"containerPort": 80}, {"containerPort": 80, "protocol": "TCP"}]),
    ),
    _case(
        "template-grace-period-string",
        f"{TEMPLATE}.terminationGracePeriodSeconds",
        nested("worker.template.spec.terminationGracePeriodSeconds", "30s"),
    ),
    *(
        _case(
            f"template-env-{name.lower().replace('_', '-')}",
            f"{TRAINER}.env[0].name",
            trainer_container(env=[{"name": name, "value": "1"}]),
            says="pod contract",
        )
        for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "PET_NNODES", "TORCHFLEET_JOB_NAME")
    ),
    _case(
        "template-sidecar-env-reserved",
        f"{TEMPLATE}.containers[1].env[1].name",
        nested(
            "worker.template.spec.containers",
            [
                {"name": "trainer"},
                {"name": "log", "env": [{"name": "LOG", "value": "1"}, {"name": "NODE_RANK"}]},
            ],
        ),
        says="pod contract",
    ),
)


def elastic(min_nodes: int, max_nodes: int, workers: int, **fields: Any) -> Manifest:
    """A 1 + ``workers`` job elastic between ``min_nodes`` and ``max_nodes``."""
    spec = {"minNodes": min_nodes, "maxNodes": max_nodes, **fields}
    return merge(nested("worker.replicas", workers), {"elastic": spec})


# spec.elastic: bounds, the desired size, and layouts that cannot follow every size.
ELASTIC_CASES: tuple[Invalid, ...] = (
    _case(
        "in-place-elastic",
        "spec.runPolicy.inPlaceRestarts",
        elastic(1, 3, 2),
        nested("runPolicy.inPlaceRestarts", 2),
        says="elastic.maxRestarts",
    ),
    _case(
        "in-place-own-command",
        "spec.runPolicy.inPlaceRestarts",
        nested("runPolicy.inPlaceRestarts", 2),
        {"command": ["torchrun", "train.py"]},
        says="built-in trainer",
    ),
    _case("elastic-min-zero", "spec.elastic.minNodes", elastic(0, 4, 3)),
    _case("elastic-min-above-max", "spec.elastic.minNodes", elastic(3, 2, 1), says="maxNodes"),
    _case("elastic-max-beyond-workers", "spec.elastic.maxNodes", elastic(1, 4097, 3)),
    _case("elastic-max-missing", "spec.elastic.maxNodes", nested("elastic.minNodes", 1)),
    _case(
        "elastic-restarts-negative", "spec.elastic.maxRestarts", elastic(1, 4, 3, maxRestarts=-1)
    ),
    _case("elastic-size-below-min", "spec.worker.replicas", elastic(3, 4, 1), says="minNodes"),
    _case("elastic-size-above-max", "spec.worker.replicas", elastic(1, 2, 3), says="maxNodes"),
    _case(
        "elastic-command-names-node-rank",
        "spec.command",
        elastic(2, 4, 3),
        {"command": ["torchrun", "--node-rank=$(NODE_RANK)", "train.py"]},
        says="rendezvous round",
    ),
    _case(
        "elastic-args-name-rank-with-one-process",
        "spec.command",
        elastic(2, 4, 3),
        {"processesPerNode": 1, "command": ["python"], "args": ["train.py", "--rank=$(RANK)"]},
        says="rendezvous round",
    ),
    _case(
        "elastic-fixed-shard",
        "spec.trainer.parallel.dataParallelShard",
        elastic(2, 4, 3),
        nested("trainer.parallel.dataParallelShard", 4),
        says="follows the nodes",
    ),
    # 4 nodes x 2 processes split into 4 stages (or tensor shards), but 3 nodes' 6 do not.
    *(
        _case(
            f"elastic-{degree}-across-nodes",
            "spec.trainer.parallel",
            elastic(2, 4, 3),
            {"processesPerNode": 2},
            nested("trainer", {"model": {"layers": 8, "heads": 8}, "parallel": {degree: 4}}),
            says="divide processesPerNode",
        )
        for degree in ("pipeline", "tensor")
    ),
    # The global batch must split at every size: with a micro batch of 3 (12 over 4
    # nodes), 3 nodes take 9; with one of 4, 4 nodes take 16.
    *(
        _case(
            f"elastic-{id}",
            "spec.trainer.training.globalBatchSize",
            elastic(2, 4, 3),
            nested("trainer.training", training),
            says="every",
        )
        for id, training in (
            ("batch-does-not-split-at-3-nodes", {"globalBatchSize": 12}),
            ("micro-batch-does-not-split-at-4-nodes", {"globalBatchSize": 24, "microBatchSize": 4}),
        )
    ),
    _case(
        "elastic-cuda-graphs",
        "spec.trainer.training.cudaGraphs",
        merge(
            elastic(2, 2, 1),
            nested("trainer.training", {"compile": True, "cudaGraphs": True}),
        ),
        says="elastic",
    ),
    _case(
        "elastic-pipeline-microbatches-do-not-split-the-micro-batch",
        "spec.trainer.training.globalBatchSize",
        elastic(2, 4, 3),
        {"processesPerNode": 2},
        nested(
            "trainer",
            {
                "model": {"layers": 8},
                "training": {"globalBatchSize": 48, "microBatchSize": 2},
                "parallel": {"pipeline": 2, "pipelineMicrobatches": 4},
            },
        ),
        says="pipelineMicrobatches",
    ),
)

INVALID: tuple[Invalid, ...] = (
    *TEMPLATE_CASES,
    _case("master-replicas-2", "spec.master.replicas", nested("master.replicas", 2)),
    _case("worker-replicas-negative", "spec.worker.replicas", nested("worker.replicas", -1)),
    _case("worker-replicas-too-many", "spec.worker.replicas", nested("worker.replicas", 5000)),
    _case("worker-replicas-string", "spec.worker.replicas", nested("worker.replicas", "3")),
    _case("processes-zero", "spec.processesPerNode", {"processesPerNode": 0}),
    _case("processes-word", "spec.processesPerNode", {"processesPerNode": "eight"}),
    _case("processes-gpu-without-gpus", "spec.processesPerNode", {"processesPerNode": "gpu"}),
    _case(
        "rank-in-command-with-several-processes",
        "spec.command",
        {"processesPerNode": 4, "command": ["torchrun", "--node_rank=$(RANK)", "train.py"]},
        says="$(NODE_RANK)",
    ),
    _case(
        "world-size-in-args-with-gpu-processes",
        "spec.command",
        TWO_GPUS,
        {"processesPerNode": "gpu", "command": ["torchrun"], "args": ["--nnodes=$(WORLD_SIZE)"]},
        says="$(NNODES)",
    ),
    # The seed's DeepSpeed command as it was: its launcher would ssh to the other pods.
    _case(
        "deepspeed-over-ssh",
        "spec.command",
        nested("worker.replicas", 1),
        {
            "command": [
                "deepspeed",
                "--hostfile=/etc/deepspeed/hostfile",
                "--num_gpus=8",
                "--master_addr=$(MASTER_ADDR)",
                "train.py",
            ]
        },
        says="--no_ssh",
    ),
    _case(
        "deepspeed-no-ssh-without-node-rank",
        "spec.command",
        {"command": ["/usr/local/bin/deepspeed", "--hostfile", "/etc/deepspeed/hostfile"]},
        {"args": ["--no_ssh", "train.py"]},
        says="--node_rank",
    ),
    _case("gpus-too-many", "spec.resources.gpus", nested("resources.gpus", 65)),
    _case("memory-not-quantity", "spec.resources.memory", nested("resources.memory", "lots")),
    _case("cpu-negative", "spec.resources.cpu", nested("resources.cpu", -1)),
    _case(
        "gpu-resource-unqualified",
        "spec.resources.gpuResourceName",
        nested("resources.gpuResourceName", "gpu"),
    ),
    _case("image-empty", "spec.image", {"image": ""}),
    _case("unknown-field", "spec.workers", {"workers": {"replicas": 2}}),
    _case("trainer-and-command", "spec.command", {"trainer": {}, "command": ["python"]}),
    _case("args-without-command", "spec.args", {"args": ["--epochs", "3"]}),
    _case("command-empty", "spec.command", {"command": []}),
    _case("transport-unknown", "spec.network.transport", nested("network.transport", "ethernet")),
    _case(
        "nccl-env-foreign-key",
        "spec.network.ncclEnv",
        nested("network.ncclEnv", {"OMP_NUM_THREADS": "4"}),
    ),
    _case(
        "nccl-env-lowercase",
        "spec.network.ncclEnv",
        nested("network.ncclEnv", {"NCCL_debug": "INFO"}),
    ),
    _case(
        "nccl-env-overrides-field",
        "spec.network.ncclEnv",
        {"network": {"socketInterface": "eth0", "ncclEnv": {"NCCL_SOCKET_IFNAME": "eth1"}}},
    ),
    _case(
        "tcp-with-hcas",
        "spec.network.ibHCAs",
        {"network": {"transport": "tcp", "ibHCAs": ["mlx5_0"]}},
    ),
    _case(
        "nccl-env-overrides-transport",
        "spec.network.ncclEnv",
        {"network": {"transport": "infiniband", "ncclEnv": {"NCCL_NET": "Socket"}}},
        says="NCCL_NET",
    ),
    _case(
        "ib-hca-match-unknown",
        "spec.network.ibHCAMatch",
        nested("network.ibHCAMatch", "Regex"),
    ),
    _case("gid-index-range", "spec.network.gidIndex", nested("network.gidIndex", 300)),
    _case(
        "gdr-level-unknown",
        "spec.network.gpuDirectRDMALevel",
        nested("network.gpuDirectRDMALevel", "NEAR"),
    ),
    _case(
        "rdma-resource-unqualified",
        "spec.network.rdmaResources",
        nested("network.rdmaResources", {"rdma": 1}),
    ),
    _case(
        "rdma-resource-zero",
        "spec.network.rdmaResources",
        nested("network.rdmaResources", {"rdma/ib": 0}),
    ),
    _case(
        "claim-name-and-template",
        "spec.checkpoint.claimName",
        {"checkpoint": {"claimName": "ckpt", **CLAIM}},
    ),
    _case("claim-neither", "spec.checkpoint.claimName", {"checkpoint": {"mountPath": "/ckpt"}}),
    _case(
        "claim-name-invalid",
        "spec.checkpoint.claimName",
        nested("checkpoint.claimName", "Bad_Name"),
    ),
    _case(
        "mount-path-relative",
        "spec.checkpoint.mountPath",
        {"checkpoint": {**CLAIM, "mountPath": "ckpt"}},
    ),
    _case(
        "claim-size-missing",
        "spec.checkpoint.claimTemplate.size",
        nested("checkpoint.claimTemplate", {"storageClassName": "fast"}),
    ),
    _case(
        "access-mode-read-only",
        "spec.checkpoint.claimTemplate.accessModes",
        nested("checkpoint.claimTemplate", {"size": "1Gi", "accessModes": ["ReadOnlyMany"]}),
    ),
    _case(
        "access-mode-duplicate",
        "spec.checkpoint.claimTemplate.accessModes",
        nested(
            "checkpoint.claimTemplate",
            {"size": "1Gi", "accessModes": ["ReadWriteOnce", "ReadWriteOnce"]},
        ),
    ),
    _case(
        "restart-policy-always",
        "spec.runPolicy.restartPolicy",
        nested("runPolicy.restartPolicy", "Always"),
    ),
    _case(
        "exit-code-both-lists",
        "spec.runPolicy.retryableExitCodes",
        {"runPolicy": {"retryableExitCodes": [137, 143], "permanentExitCodes": [1, 137]}},
    ),
    _case(
        "retryable-with-never",
        "spec.runPolicy.retryableExitCodes",
        {"runPolicy": {"restartPolicy": "Never", "retryableExitCodes": [137]}},
    ),
    _case(
        "exit-code-zero",
        "spec.runPolicy.permanentExitCodes",
        nested("runPolicy.permanentExitCodes", [0]),
    ),
    _case("backoff-negative", "spec.runPolicy.backoffLimit", nested("runPolicy.backoffLimit", -1)),
    _case(
        "deadline-zero",
        "spec.runPolicy.activeDeadlineSeconds",
        nested("runPolicy.activeDeadlineSeconds", 0),
    ),
    _case(
        "clean-pod-policy-unknown",
        "spec.runPolicy.cleanPodPolicy",
        nested("runPolicy.cleanPodPolicy", "Some"),
    ),
    _case(
        "all-workers-without-workers",
        "spec.runPolicy.successPolicy",
        nested("runPolicy.successPolicy", "AllWorkers"),
    ),
    _case(
        "termination-grace-zero",
        "spec.runPolicy.terminationGracePeriodSeconds",
        nested("runPolicy.terminationGracePeriodSeconds", 0),
    ),
    _case(
        "termination-grace-over-a-day",
        "spec.runPolicy.terminationGracePeriodSeconds",
        nested("runPolicy.terminationGracePeriodSeconds", 86_401),
    ),
    *(
        _case(
            f"template-grace-contradicts-run-policy-{role}",
            f"spec.{role}.template.spec.terminationGracePeriodSeconds",
            nested("runPolicy.terminationGracePeriodSeconds", 120),
            nested(f"{role}.template.spec.terminationGracePeriodSeconds", 600),
            says="contradicts spec.runPolicy.terminationGracePeriodSeconds",
        )
        for role in ("master", "worker")
    ),
    _case("pod-group-unknown", "spec.scheduling.podGroup", nested("scheduling.podGroup", "Kueue")),
    _case(
        "timeout-without-pod-group",
        "spec.scheduling.scheduleTimeoutSeconds",
        nested("scheduling.scheduleTimeoutSeconds", 60),
    ),
    _case(
        "timeout-with-volcano",
        "spec.scheduling.scheduleTimeoutSeconds",
        nested("scheduling", {"podGroup": "Volcano", "scheduleTimeoutSeconds": 60}),
    ),
    _case(
        "template-scheduler-contradicts-volcano",
        "spec.worker.template.spec.schedulerName",
        nested("scheduling.podGroup", "Volcano"),
        nested("worker.template.spec.schedulerName", "default-scheduler"),
        says="contradicts spec.scheduling",
    ),
    _case(
        "template-scheduler-contradicts-scheduler-name",
        "spec.master.template.spec.schedulerName",
        nested("scheduling", {"podGroup": "Coscheduling", "schedulerName": "gang"}),
        nested("master.template.spec.schedulerName", "default-scheduler"),
        says="contradicts spec.scheduling",
    ),
    _case(
        "queue-name-space", "spec.scheduling.queueName", nested("scheduling.queueName", "team a")
    ),
    _case(
        "topology-without-key",
        "spec.scheduling.topology.key",
        nested("scheduling.topology", {"mode": "Required"}),
    ),
    # A label key's name is at most 63 characters, its prefix or not.
    _case(
        "topology-key-name-too-long",
        "spec.scheduling.topology.key",
        nested("scheduling.topology.key", "example.com/" + "r" * 64),
    ),
    _case(
        "topology-key-not-a-label-key",
        "spec.scheduling.topology.key",
        nested("scheduling.topology.key", "rack id"),
    ),
    _case(
        "degrees-do-not-fit",
        "spec.trainer.parallel",
        merge(nested("worker.replicas", 1), nested("trainer.parallel.tensor", 3)),
    ),
    _case(
        "fixed-degrees-wrong-product",
        "spec.trainer.parallel",
        merge(
            TWO_GPUS,
            {"processesPerNode": "gpu"},
            nested("trainer.parallel", {"dataParallelShard": 4}),
        ),
    ),
    _case(
        "trainer-shard-zero",
        "spec.trainer.parallel",
        nested("trainer.parallel.dataParallelShard", 0),
    ),
    _case(
        "trainer-dim-heads",
        "spec.trainer.model",
        nested("trainer.model", {"dim": 100}),
        says="divisible by heads",
    ),
    _case("trainer-steps-zero", "spec.trainer.training.steps", nested("trainer.training.steps", 0)),
    _case(
        # A valid Python identifier, but the API server's RE2 has an ASCII \w:
        # both sides must refuse it.
        "trainer-import-path-not-ascii",
        "spec.trainer.model.importPath",
        nested("trainer.model.importPath", "módulo:fábrica"),
    ),
    _case(
        "trainer-precision-unknown",
        "spec.trainer.training.precision",
        nested("trainer.training.precision", "fp8"),
    ),
    _case(
        "trainer-char-without-path",
        "spec.trainer.data",
        nested("trainer.data.kind", "char"),
        says="path",
    ),
    _case("trainer-unknown-field", "spec.trainer.optimiser", nested("trainer.optimiser", {})),
    _case(
        "trainer-kv-heads-do-not-divide",
        "spec.trainer.model",
        nested("trainer.model", {"architecture": "llama", "heads": 6, "kvHeads": 4}),
        says="kvHeads",
    ),
    _case(
        "trainer-llama-odd-head-dim",
        "spec.trainer.model",
        nested("trainer.model", {"architecture": "llama", "heads": 8, "dim": 120}),
        says="even head dimension",
    ),
    _case(
        "trainer-batch-not-divisible",
        "spec.trainer.training",
        nested("trainer.training", {"globalBatchSize": 10, "gradAccumSteps": 4}),
        says="gradAccumSteps",
    ),
    _case(
        "trainer-cuda-graphs-without-compile",
        "spec.trainer.training",
        nested("trainer.training", {"compile": False, "cudaGraphs": True}),
        says="compile",
    ),
    *(
        _case(
            f"trainer-cuda-graphs-with-{id}",
            "spec.trainer.training",
            nested("trainer.training", {"compile": True, "cudaGraphs": True, **training}),
            says="gradient accumulation",
        )
        for id, training in (
            ("accumulation", {"globalBatchSize": 8, "gradAccumSteps": 2}),
            ("smaller-micro-batch", {"globalBatchSize": 8, "microBatchSize": 4}),
        )
    ),
    _case(
        "trainer-micro-batch-and-accumulation",
        "spec.trainer.training",
        nested("trainer.training", {"microBatchSize": 2, "gradAccumSteps": 2}),
        says="not both",
    ),
    _case(
        "trainer-eval-without-validation-split",
        "spec.trainer",
        nested("trainer.data", {"kind": "char", "path": "in.txt", "valFraction": 0}),
        says="valFraction",
    ),
    _case(
        "trainer-tied-embeddings-with-pipeline",
        "spec.trainer",
        merge(
            nested("worker.replicas", 1),
            nested("trainer", {"model": {"tieEmbeddings": True}, "parallel": {"pipeline": 2}}),
        ),
        says="tieEmbeddings",
    ),
    _case(
        "trainer-seq-len-beyond-model",
        "spec.trainer",
        nested("trainer", {"data": {"seqLen": 512}, "model": {"maxSeqLen": 256}}),
        says="model.maxSeqLen",
    ),
    _case(
        "trainer-tensor-does-not-divide-heads",
        "spec.trainer",
        merge(
            nested("worker.replicas", 3),
            nested("trainer", {"model": {"heads": 6}, "parallel": {"tensor": 4}}),
        ),
        says="model.heads",
    ),
    _case(
        "trainer-more-stages-than-layers",
        "spec.trainer",
        merge(
            nested("worker.replicas", 3),
            nested("trainer", {"model": {"layers": 2}, "parallel": {"pipeline": 4}}),
        ),
        says="exceed model.layers",
    ),
    _case(
        "batch-does-not-split-over-ranks",
        "spec.trainer.training.globalBatchSize",
        {"processesPerNode": 2, "worker": {"replicas": 1}},
        nested("trainer.training.globalBatchSize", 6),
        says="data-parallel degree",
    ),
    _case(
        "microbatches-do-not-split",
        "spec.trainer.parallel.pipelineMicrobatches",
        nested("worker.replicas", 1),
        nested("trainer.training.globalBatchSize", 6),
        nested("trainer.parallel", {"pipeline": 2, "pipelineMicrobatches": 4}),
    ),
    _case(
        "sequence-parallel-seq-len",
        "spec.trainer.data.seqLen",
        nested("worker.replicas", 1),
        nested("trainer", {"data": {"seqLen": 255}, "parallel": {"tensor": 2}}),
    ),
    *ELASTIC_CASES,
    _case("name-too-long", "metadata.name", {}, name="j" * 49),
    _case("name-starts-with-digit", "metadata.name", {}, name="9lives"),
)


# The trainer's knobs under the reserved TORCHFLEET_ prefix that a template may
# set (contract.USER_ENV_NAMES): both sides accept them, on the trainer and on a
# sidecar. Each a (id, spec) pair.
KNOBS_ACCEPTED: tuple[tuple[str, Manifest], ...] = tuple(
    (
        f"knob-{name.removeprefix('TORCHFLEET_').lower().replace('_', '-')}",
        trainer_container(env=[{"name": name, "value": "30"}]),
    )
    for name in contract.USER_ENV_NAMES
)


# Elastic specs both sides accept: each a (id, spec) pair.
ELASTIC_ACCEPTED: tuple[tuple[str, Manifest], ...] = (
    ("elastic-at-max", elastic(2, 4, 3)),
    ("elastic-at-min", elastic(2, 4, 1, maxRestarts=0)),
    ("elastic-one-size", elastic(3, 3, 2, maxRestarts=1000)),
    ("elastic-from-one-node", elastic(1, 4096, 0)),
    (
        # Pipeline within a node: every node count keeps whole stages.
        "elastic-pipeline-within-a-node",
        merge(
            elastic(2, 4, 3),
            {"processesPerNode": 2},
            nested("trainer", {"model": {"layers": 8}, "parallel": {"pipeline": 2}}),
            nested("trainer.training", {"globalBatchSize": 48, "microBatchSize": 2}),
        ),
    ),
    (
        # 2, 3 and 4 nodes x a micro batch of 2 all divide 24.
        "elastic-micro-batch-splits-at-every-size",
        merge(
            elastic(2, 4, 3),
            nested("trainer.training", {"globalBatchSize": 24, "microBatchSize": 2}),
        ),
    ),
    (
        # Without microBatchSize: 4 nodes x 3 accumulation steps give a micro batch of 2.
        "elastic-batch-splits-at-every-size",
        merge(
            elastic(3, 4, 3),
            nested("trainer.training", {"globalBatchSize": 24, "gradAccumSteps": 3}),
        ),
    ),
    (
        # One size only: a fixed shard is fine, as in a fixed gang.
        "elastic-one-size-fixed-shard",
        merge(elastic(2, 2, 1), nested("trainer.parallel.dataParallelShard", 2)),
    ),
    (
        "elastic-torchrun-with-node-count",
        merge(elastic(2, 4, 3), {"command": ["torchrun", "--nnodes=$(PET_NNODES)", "t.py"]}),
    ),
)


# DeepSpeed's launcher, each pod launching its own node (or one node, no hostfile:
# DeepSpeed then runs locally without ssh).
_DS_OWN_NODE = ["--no_ssh", "--node_rank=$(NODE_RANK)", "--master_port=$(MASTER_PORT)"]
DEEPSPEED_ACCEPTED: tuple[tuple[str, Manifest], ...] = (
    ("one-node-local", {"command": ["deepspeed", "--num_gpus=8", "train.py"]}),
    (
        "own-node",
        {
            "worker": {"replicas": 1},
            "command": ["deepspeed", "--hostfile=/etc/deepspeed/hostfile", *_DS_OWN_NODE],
            "args": ["train.py", "--deepspeed"],
        },
    ),
    (
        "flags-in-args",
        {
            "worker": {"replicas": 3},
            "command": ["/opt/conda/bin/deepspeed"],
            "args": ["--no_ssh", "--node_rank", "$(NODE_RANK)", "train.py"],
        },
    ),
    ("not-the-launcher", {"worker": {"replicas": 1}, "command": ["python", "deepspeed"]}),
)
