"""One process started by the elastic launcher: ``python -m torchfleet_trainer.worker JSON``.

A command rather than a Python function as the launcher's entry point: a
function's process waits for the launcher to collect its return value, which a
launcher shutting down on SIGTERM never does, so a preempted worker would sit
until the kill timeout instead of exiting right after its checkpoint.
"""

from __future__ import annotations

import sys

from torchfleet_trainer.config import TrainConfig
from torchfleet_trainer.launch import train


def main() -> int:
    config = TrainConfig.model_validate_json(sys.argv[1])
    return train(config)


if __name__ == "__main__":
    sys.exit(main())
