"""A pod's environment: the pod contract, then NCCL/IB from spec.network.

This is the one place that decides a pod's env. The trainer container's own
``env`` in a role template is merged over it in ``pods.py`` (user values win).
It is also where the job's ``spec.checkpoint`` cadence is written over
``spec.trainer.checkpoint`` in the rendered trainer config: the trainer only
reads the result.
"""

from __future__ import annotations

import json
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_contract.pod import ElasticRendezvous, PodContract
from torchfleet_operator.api.v1alpha1 import NetworkSpec, TrainingJobSpec
from torchfleet_operator.desired import hostfile, names


def elastic_rendezvous(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, node_rank: int, restart: int
) -> ElasticRendezvous | None:
    """torchrun's c10d rendezvous for an elastic job's pod; None for a fixed gang.

    The master's agent serves the store on the gang generation's rendezvous port
    (``is_host=1``; losing it restarts the gang). The id is the job's and
    changes only with a gang restart, so a recreated worker joins the running
    rendezvous and a stale agent of an older gang cannot."""
    if spec.elastic is None:
        return None
    endpoint = f"{names.master_address(job, namespace)}:{contract.rendezvous_port(restart)}"
    pod = names.pod_name_for_rank(job, node_rank)
    return ElasticRendezvous(
        min_nodes=spec.elastic.min_nodes,
        max_nodes=spec.elastic.max_nodes,
        endpoint=endpoint,
        run_id=f"{uid or job}-{restart}",
        max_restarts=spec.elastic.max_restarts,
        conf=f"{contract.RDZV_IS_HOST}={int(node_rank == 0)}",
        local_addr=names.pod_address(job, namespace, pod),
    )


def contract_env(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, node_rank: int, restart: int
) -> dict[str, str]:
    """torchrun's PET_*, MASTER_*, NNODES/NODE_RANK, per-process ranks when 1 per pod,
    checkpoint cadence and the trainer config; an elastic pod's rendezvous instead
    of node and process ranks."""
    checkpoint = spec.checkpoint
    elastic = elastic_rendezvous(job, namespace, uid, spec, node_rank, restart)
    return PodContract(
        job_name=job,
        namespace=namespace,
        master_addr=names.master_address(job, namespace),
        master_port=contract.rendezvous_port(restart),
        nodes=spec.nodes,
        node_rank=node_rank,
        processes_per_node=spec.resolved_processes_per_node,
        restart_count=restart,
        checkpoint_dir=checkpoint.mount_path if checkpoint else None,
        checkpoint_interval=checkpoint.interval_steps if checkpoint else None,
        checkpoint_keep=checkpoint.keep_last if checkpoint else None,
        metrics_port=contract.DEFAULT_METRICS_PORT,
        train_config=trainer_config(spec),
        elastic=elastic,
        in_place_restarts=spec.in_place_restarts,
    ).to_env() | exit_code_policy(spec)


def exit_code_policy(spec: TrainingJobSpec) -> dict[str, str]:
    """The run policy's exit-code rule, for the launchers that restart in place:
    they judge a failed process as the operator would judge its pod."""
    policy = spec.run_policy
    if not spec.in_place_restarts:
        return {}
    return {
        contract.RESTART_POLICY: policy.restart_policy,
        contract.RETRYABLE_EXIT_CODES: ",".join(map(str, policy.retryable_exit_codes or ())),
        contract.PERMANENT_EXIT_CODES: ",".join(map(str, policy.permanent_exit_codes or ())),
    }


def trainer_config(spec: TrainingJobSpec) -> str | None:
    """The inline config for torchfleet-train (None for a command of the user's own).

    The job's spec.checkpoint.intervalSteps and keepLast win over
    spec.trainer.checkpoint's interval and keepLast; the trainer's command-line
    overrides (spec.args) still win over both."""
    if not spec.runs_trainer:
        return None
    config: dict[str, Any] = (
        spec.trainer.model_dump(mode="json", by_alias=True, exclude_unset=True)
        if spec.trainer
        else {}
    )
    policy = {
        "interval": spec.checkpoint.interval_steps if spec.checkpoint else None,
        "keepLast": spec.checkpoint.keep_last if spec.checkpoint else None,
    }
    policy = {key: value for key, value in policy.items() if value is not None}
    if policy:
        config["checkpoint"] = {**config.get("checkpoint", {}), **policy}
    if spec.trainer is None and not config:
        return None
    return json.dumps(config, separators=(",", ":"))


# NCCL's interface syntax: a leading ^ excludes, a leading = matches exactly.
_NCCL_INTERFACE_PREFIXES = ("^", "=")


def gloo_interfaces(socket_interface: str) -> str | None:
    """GLOO_SOCKET_IFNAME for ``socket_interface``, or None when it must stay unset.

    gloo reads only a comma-separated list of exact interface names: NCCL's
    ``^lo,docker`` or ``=ib0`` would make every rank fail to find the device at
    init_process_group, so those forms leave gloo to pick its own interface."""
    if socket_interface.startswith(_NCCL_INTERFACE_PREFIXES):
        return None
    return socket_interface


def network_env(network: NetworkSpec) -> dict[str, str]:
    """NCCL (and gloo) variables; the user's ncclEnv comes last (the CRD forbids overlaps)."""
    env: dict[str, str] = {}
    if network.transport == "tcp":
        env["NCCL_IB_DISABLE"] = "1"
    elif network.transport in ("infiniband", "roce"):
        env["NCCL_IB_DISABLE"] = "0"
        # Fail at start when IB is unusable instead of silently running over sockets.
        env["NCCL_NET"] = "IB"
    if network.socket_interface:
        env["NCCL_SOCKET_IFNAME"] = network.socket_interface
        gloo = gloo_interfaces(network.socket_interface)
        if gloo is not None:
            env["GLOO_SOCKET_IFNAME"] = gloo
    if network.ib_hcas:
        exact = "=" if network.ib_hca_match == "Exact" else ""
        env["NCCL_IB_HCA"] = exact + ",".join(network.ib_hcas)
    if network.gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(network.gid_index)
    if network.gpu_direct_rdma_level:
        env["NCCL_NET_GDR_LEVEL"] = network.gpu_direct_rdma_level
    env.update(network.nccl_env or {})
    return env


def pod_env(
    job: str, namespace: str, uid: str, spec: TrainingJobSpec, node_rank: int, restart: int
) -> dict[str, str]:
    env = contract_env(job, namespace, uid, spec, node_rank, restart)
    if hostfile.wanted(spec):
        env[contract.HOSTFILE] = contract.HOSTFILE_PATH
    return {**env, **network_env(spec.network)}
