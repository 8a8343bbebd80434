"""The environment the operator gives each pod of a fixed gang of one-process nodes."""

from __future__ import annotations

import json
from typing import Any

from torchfleet_contract import pod as contract


def tiny_config(nodes: int, log_interval: int, checkpoints: bool) -> dict[str, Any]:
    """A model small enough for steps of milliseconds, data parallel over ``nodes``,
    training until stopped."""
    return {
        "model": {"architecture": "gpt", "layers": 1, "heads": 2, "dim": 32, "maxSeqLen": 16},
        "data": {"kind": "synthetic", "seqLen": 16},
        "parallel": {"dataParallelReplicate": nodes, "dataParallelShard": 1},
        "training": {
            "steps": 100000,
            "globalBatchSize": 2 * nodes,
            "evalInterval": 0,
            "logInterval": log_interval,
        },
        "checkpoint": {"enabled": checkpoints, "interval": 100000},
        "tensorboard": {"enabled": False},
        "metrics": {"enabled": False},
    }


def pod_env(
    job_name: str, nodes: int, rank: int, master_port: int, config: dict[str, Any], **fields: Any
) -> dict[str, str]:
    """Node ``rank``'s pod env (one process per pod); ``fields`` are PodContract's."""
    pod = contract.PodContract(
        job_name=job_name,
        namespace="default",
        master_addr="127.0.0.1",
        master_port=master_port,
        nodes=nodes,
        node_rank=rank,
        processes_per_node=1,
        train_config=json.dumps(config),
        **fields,
    )
    return pod.to_env()
