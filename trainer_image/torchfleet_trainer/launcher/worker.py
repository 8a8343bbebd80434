"""One training process of the elastic launcher: ``run``, forked from the launcher's forkserver.

The launcher's agent starts ``run`` as a function entrypoint with the start
method "forkserver": every worker, the first round's and every in-place or
elastic round's after it, is forked from a server that imported torch and the
trainer once when the launcher started (forkserver.py), so a restarted worker
does not import again.

What that changes against a ``python -m`` command per worker:

* The worker's parent is the forkserver, not the launcher: ``launcher_pid``
  says which process to stop (``stop_launcher_if_permanent``).
* Its command line is the forkserver's and its ``/proc/<pid>/environ`` has no
  ``RANK`` (torch sets it after the fork): it names itself ``rank-<rank>``
  (procname.py), which ``ps`` shows and the tests that kill a rank look for.
* A failure leaves through ``os._exit`` with its code. A function's process
  that returns waits for its launcher to collect the value, which a launcher
  shutting down on SIGTERM never does, so a preempted worker would sit until
  the kill timeout instead of exiting right after its checkpoint. Success
  returns 0, which the agent collects.
* Output is line-buffered, as ``python -u`` made it unbuffered: the pod's log
  and the kept log file get each line when it is written, also from a rank
  that is SIGKILLed next.

The exit code is also written to ``OUTCOMES/round-<round>.rank-<local rank>.exit``,
for a launcher stopped by SIGTERM to tell a saved preemption (143) from an
unsaved one, and for the workers of the next in-place round to say why this
one failed.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from torchfleet_contract.pod import in_place_round
from torchfleet_contract.trainer_config import TrainConfig, pod_contract
from torchfleet_trainer.launcher import in_process, logtee, procname
from torchfleet_trainer.launcher.outcomes import (
    failed_round_reason,
    stop_launcher_if_permanent,
    write_outcome,
)


def run(config_json: str, outcomes: str, launcher_pid: int) -> int:
    """The agent's entrypoint: trains, reports, and exits with the outcome's code."""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ranks = pod_contract().ranks
    procname.name_this_process(ranks.rank if ranks else 0)
    code = train_and_report(TrainConfig.model_validate_json(config_json), Path(outcomes))
    stop_launcher_if_permanent(code, launcher_pid)
    logtee.finish()
    if code != 0:
        os._exit(code)
    return 0


def train_and_report(config: TrainConfig, outcomes: Path) -> int:
    """Trains; the exit code, also written where the launcher and the next round read it."""
    pod, round_ = pod_contract(), in_place_round()
    workers = pod.process.local_world_size if pod.process else 1
    reason = failed_round_reason(outcomes, round_ - 1, workers) if round_ > 0 else None

    def report(code: int) -> None:
        write_outcome(outcomes, pod.local_rank, code, round_)

    in_process.report_exit = report
    try:
        code = in_process.train(config, reason)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        traceback.print_exc()  # what Python prints before it exits 1
        code = 1
    report(code)
    return code
