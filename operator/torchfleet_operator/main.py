"""``torchfleet-operator``: run the TrainingJob operator (kopf) against a cluster.

Watches every namespace by default (``--namespace`` narrows it), runs
standalone (no kopf peering) unless ``--peering`` names a peering object,
serves kopf's liveness probe and the operator's Prometheus metrics. With
``--leader-elect`` several replicas run and one (the Lease holder) reconciles.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import kopf

from torchfleet_operator import metrics
from torchfleet_operator.config import OperatorConfig
from torchfleet_operator.controller import Controller
from torchfleet_operator.kube import Executor, make_api_client
from torchfleet_operator.leader import ElectionTiming, LeaderElector


def parse_args(
    argv: Sequence[str] | None = None, config: OperatorConfig | None = None
) -> argparse.Namespace:
    """The command line; every default is ``config``'s (default: the environment's,
    ``TORCHFLEET_OPERATOR_*``), so the environment is read once, by OperatorConfig."""
    parser = argparse.ArgumentParser(prog="torchfleet-operator", description=__doc__)
    if config is None:
        try:
            config = OperatorConfig.from_env()
        except ValueError as exc:
            parser.error(str(exc))
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; glob patterns allowed); "
        "default: all namespaces",
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig path (default: $KUBECONFIG, else in-cluster)",
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering object name for an HA pair (default: standalone)",
    )
    parser.add_argument("--health-address", default="0.0.0.0")
    parser.add_argument(
        "--health-port",
        type=int,
        default=config.health_port,
        help="liveness endpoint port (/healthz)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=config.metrics_port,
        help="Prometheus /metrics port; 0 disables",
    )
    parser.add_argument(
        "--trainer-image",
        default=config.trainer_image,
        help="image of pods whose job sets no spec.image",
    )
    parser.add_argument(
        "--default-shm-size",
        default=config.default_shm_size or None,
        help="size of /dev/shm for jobs that set no spec.resources.shmSize "
        "(a quantity, e.g. 16Gi); unset: bounded only by the pod's memory limit",
    )
    parser.add_argument(
        "--node-loss-force-delete-seconds",
        type=float,
        default=config.node_loss_force_delete_seconds,
        help="force-delete a job's pods still terminating this long after their node "
        "went NotReady/Unknown (or out-of-service), so the next gang can start",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        default=config.leader_elect,
        help="run as one of several replicas: only the holder of a coordination.k8s.io "
        "Lease reconciles; the others keep warm caches and take over when it expires",
    )
    parser.add_argument(
        "--leader-elect-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the leader Lease (default: $POD_NAMESPACE, the operator's own)",
    )
    parser.add_argument(
        "--leader-elect-name",
        default=config.lease_name,
        help="name of the leader Lease",
    )
    parser.add_argument("--log-level", default=config.log_level)
    return parser.parse_args(argv)


def effective_config(config: OperatorConfig, args: argparse.Namespace) -> OperatorConfig:
    """``config`` with what the command line overrides."""
    return dataclasses.replace(
        config,
        trainer_image=args.trainer_image,
        default_shm_size=args.default_shm_size or "",
        node_loss_force_delete_seconds=args.node_loss_force_delete_seconds,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        leader_elect=args.leader_elect,
        lease_name=args.leader_elect_name,
        log_level=args.log_level,
    )


def kopf_options(args: argparse.Namespace) -> dict[str, Any]:
    """kopf.operator's arguments: standalone unless --peering names a peering
    object (kopf's own HA: the replicas see each other through it)."""
    return {
        "standalone": args.peering is None,
        "peering_name": args.peering,
        "clusterwide": not args.namespace,
        "namespaces": args.namespace,
        "liveness_endpoint": f"http://{args.health_address}:{args.health_port}/healthz",
    }


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = OperatorConfig.from_env()
    except ValueError as exc:
        print(f"torchfleet-operator: {exc}", file=sys.stderr)
        return 2
    args = parse_args(argv, config)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = effective_config(config, args)
        timing = ElectionTiming(
            config.lease_duration_seconds,
            config.lease_renew_deadline_seconds,
            config.lease_retry_period_seconds,
        )
    except ValueError as exc:
        print(f"torchfleet-operator: {exc}", file=sys.stderr)
        return 2
    # Registers the handlers with kopf's default registry.
    from torchfleet_operator import handlers

    if args.namespace:
        handlers.watch_namespaces()

    api = make_api_client(args.kubeconfig, pool_size=config.workers * config.api_concurrency)
    # kopf's own client reads the same kubeconfig.
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    leader = None
    if args.leader_elect:
        leader = LeaderElector(
            api,
            args.leader_elect_namespace,
            args.leader_elect_name,
            f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
            timing,
        )
    executor = Executor(api, config.api_concurrency)
    if leader is not None:
        # No write once the lease ran out by this replica's clock, even before
        # the renew loop notices (a process frozen past its lease wakes with both).
        executor.raw.fence = leader.holds_lease
    controller = Controller(config, executor, leader=leader, namespaces=args.namespace)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.health_address)
    asyncio.run(kopf.operator(**kopf_options(args), memo=kopf.Memo(controller=controller)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
