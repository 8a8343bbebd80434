"""``python -m nodeagent`` (with ``dev/`` on the path): run the node agent
until SIGTERM or SIGINT, then stop its pods and clean up."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from . import node as nodes
from .agent import Agent, AgentConfig


def name_value(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nodeagent", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        help="pod logs, volumes (PVCs as directories) and scratch space",
    )
    parser.add_argument(
        "--node",
        action="append",
        dest="nodes",
        default=[],
        help="a node name to register (repeat for more); default tf-local-0/1",
    )
    parser.add_argument(
        "--session",
        default=nodes.DEFAULT_SESSION,
        help="value of the nodes' torchfleet.dev/local-node label and taint (default "
        "'true', what the examples select); give each agent on one cluster its own",
    )
    parser.add_argument("--bridge", default="tfleet0", help="Linux bridge the pods attach to")
    parser.add_argument(
        "--cidr", default="10.253.0.0/16", help="pod network; node i gets the (i+1)-th /24 of it"
    )
    parser.add_argument(
        "--bin-dir",
        default=os.path.dirname(sys.executable),
        help="first on every container's PATH (the node's 'image')",
    )
    parser.add_argument(
        "--container-env",
        action="append",
        default=[],
        type=name_value,
        metavar="NAME=VALUE",
        help="put NAME=VALUE in every container's environment (repeat for more), as "
        "a node image's ENV would",
    )
    parser.add_argument(
        "--keep-nodes", action="store_true", help="leave the Node objects registered on exit"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if os.geteuid() != 0:
        sys.exit("nodeagent: needs root (network and mount namespaces)")
    config = AgentConfig(
        kubeconfig=args.kubeconfig,
        node_names=args.nodes or ["tf-local-0", "tf-local-1"],
        state_dir=args.state_dir.resolve(),
        bridge=args.bridge,
        cidr=args.cidr,
        session=args.session,
        bin_dir=args.bin_dir,
        extra_env=dict(args.container_env),
    )
    agent = Agent(config)

    def stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("nodeagent").info("signal %d: stopping", signum)
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        agent.start()
        agent.run_forever()
    finally:
        agent.shutdown(delete_nodes=not args.keep_nodes)


if __name__ == "__main__":
    main()
