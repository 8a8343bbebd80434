"""One process started by the elastic launcher: ``python -m torchfleet_trainer.worker JSON``.

A command rather than a Python function as the launcher's entry point: a
function's process waits for the launcher to collect its return value, which a
launcher shutting down on SIGTERM never does, so a preempted worker would sit
until the kill timeout instead of exiting right after its checkpoint.

``python -m torchfleet_trainer.worker JSON OUTCOMES``: the exit code is also
written to ``OUTCOMES/rank-<local rank>.exit``, for a launcher stopped by SIGTERM
to tell a saved preemption (143) from an unsaved one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torchfleet_trainer.config import TrainConfig, pod_contract
from torchfleet_trainer.launch import train, write_outcome


def main() -> int:
    config = TrainConfig.model_validate_json(sys.argv[1])
    code = train(config)
    if len(sys.argv) > 2:
        write_outcome(Path(sys.argv[2]), pod_contract().local_rank, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
