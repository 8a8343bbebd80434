"""One process started by the elastic launcher: ``python -m torchfleet_trainer.worker JSON``.

A command rather than a Python function as the launcher's entry point: a
function's process waits for the launcher to collect its return value, which a
launcher shutting down on SIGTERM never does, so a preempted worker would sit
until the kill timeout instead of exiting right after its checkpoint.

``python -m torchfleet_trainer.worker JSON OUTCOMES``: the exit code is also
written to ``OUTCOMES/round-<round>.rank-<local rank>.exit``, for a launcher
stopped by SIGTERM to tell a saved preemption (143) from an unsaved one, and for
the workers of the next in-place round to say why this one failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torchfleet_trainer import launch
from torchfleet_trainer.config import TrainConfig, pod_contract
from torchfleet_trainer.contract import in_place_round
from torchfleet_trainer.launch import (
    failed_round_reason,
    stop_launcher_if_permanent,
    train,
    write_outcome,
)


def main() -> int:
    config = TrainConfig.model_validate_json(sys.argv[1])
    if len(sys.argv) <= 2:
        return train(config)
    outcomes, pod, round_ = Path(sys.argv[2]), pod_contract(), in_place_round()
    workers = pod.process.local_world_size if pod.process else 1
    reason = failed_round_reason(outcomes, round_ - 1, workers) if round_ > 0 else None

    def report(code: int) -> None:
        write_outcome(outcomes, pod.local_rank, code, round_)

    launch.report_exit = report
    try:
        code = train(config, reason)
    except BaseException:
        report(1)  # an uncaught error: Python exits 1 after its traceback
        stop_launcher_if_permanent(1)
        raise
    report(code)
    stop_launcher_if_permanent(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
