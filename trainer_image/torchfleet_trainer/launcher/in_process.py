"""Training in this process, and the exit code its outcome calls for.

``train`` keeps the process's output on the checkpoint volume, imports the
training stack (late: a launcher whose workers train never needs it) and turns
how the run ended into torchfleet-train's exit code (outcomes.py); a rank that
lost its gang leaves at once (``exit_on_peer_failure``). Called by the launcher
for a process that trains alone (launch.train_alone) and by each worker its
agent forks (worker.py), which sets ``report_exit`` to write its outcome.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

from torchfleet_contract.trainer_config import (
    TrainConfig,
    pod_contract,
    recovery_settings,
    resolve_checkpoint_dir,
)
from torchfleet_trainer.launcher import logtee
from torchfleet_trainer.launcher.logtee import keep_logs
from torchfleet_trainer.launcher.outcomes import (
    EXIT_COLLECTIVE_FAILED,
    EXIT_DIVERGED,
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_UNSAVED,
    EXIT_PREFLIGHT_FAILED,
)

# Set by worker.py: reports this worker's exit code for its launcher, also on a
# path that leaves through os._exit.
report_exit: Callable[[int], None] = lambda code: None  # noqa: E731


def train(config: TrainConfig, restart_reason: str | None = None) -> int:
    """Trains in this process (its output kept on the checkpoint volume too); the
    exit code its outcome calls for. ``restart_reason``: why this pod's workers of
    the previous in-place round failed (worker.py's), None in the first."""
    pod = pod_contract()
    rank = pod.ranks.rank if pod.ranks else 0
    keep_logs(resolve_checkpoint_dir(config, pod), rank, recovery_settings())
    # Deferred: a launcher whose workers train never needs the training stack
    # (seconds of imports, paid again by every elastic agent before it joins).
    from torchfleet_trainer.preflight import PreflightFailed
    from torchfleet_trainer.timeouts import is_peer_failure
    from torchfleet_trainer.train import TrainingDiverged, run_worker

    try:
        return exit_code(run_worker(config, restart_reason).status)
    except TrainingDiverged as err:
        print(f"torchfleet-train: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except PreflightFailed as err:
        print(f"torchfleet-train: preflight: {err}", file=sys.stderr)
        return EXIT_PREFLIGHT_FAILED
    except Exception as err:
        if not is_peer_failure(err):
            raise
        exit_on_peer_failure(err)


def exit_on_peer_failure(err: BaseException) -> NoReturn:
    """Logs which rank lost its gang and how, then exits 202 at once: threads
    still waiting on the gang (an async save's, the batch prefetcher's) would
    hold an orderly exit up, and nothing they hold is worth keeping."""
    ranks = pod_contract().process
    who = f"rank {ranks.rank}/{ranks.world_size}" if ranks else "this process"
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(
        f"torchfleet-train: {who}: a collective failed waiting on a peer that is silent "
        f"or gone ({first_line}); exiting {EXIT_COLLECTIVE_FAILED} (retryable)",
        file=sys.stderr,
        flush=True,
    )
    report_exit(EXIT_COLLECTIVE_FAILED)
    logtee.finish()
    os._exit(EXIT_COLLECTIVE_FAILED)


def exit_code(status: str) -> int:
    codes = {"preempted": EXIT_PREEMPTED, "preempted_unsaved": EXIT_PREEMPTED_UNSAVED}
    return codes.get(status, 0)
