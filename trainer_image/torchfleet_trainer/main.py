"""``torchfleet-train``: parse arguments and validate the config without torch.

Importing torch takes seconds, so ``--help``, ``--print-config`` and config
errors answer before it is imported; only a valid config reaches the launcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from torchfleet_contract import pod as contract
from torchfleet_contract.trainer_config import ConfigError, TrainConfig, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchfleet-train",
        description="Train a decoder-only transformer with DDP, FSDP2, TP, PP or their "
        "composition. The config comes from --config, else the JSON in "
        f"${contract.TRAIN_CONFIG}, else defaults; key.sub=value arguments override it.",
        epilog="example: torchfleet-train --config job.yaml training.steps=100 parallel.tensor=2",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON trainer config.")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="Processes to start in this pod through torch.distributed.run; defaults to "
        f"${contract.NPROC_PER_NODE}, else 1 (this process trains itself).",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="Print the validated config as JSON and exit."
    )
    parser.add_argument(
        "--schema", action="store_true", help="Print the config's JSON schema and exit."
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="Config overrides (YAML values)."
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.schema:
        print(json.dumps(TrainConfig.model_json_schema(by_alias=True), indent=2))
        return 0
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"torchfleet-train: invalid config: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.model_dump_json(by_alias=True, indent=2))
        return 0
    # Deferred: pulls in torch.
    from torchfleet_trainer.launcher.launch import launch

    return launch(config, processes_per_node=args.nproc_per_node)


if __name__ == "__main__":
    sys.exit(main())
