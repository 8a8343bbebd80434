"""The launcher's exit codes and its workers' outcome reports.

What each of torchfleet-train's exit codes means; where each worker writes the
code it exits with (``OUTCOMES/round-<round>.rank-<local rank>.exit``); and
what is read back from those reports: the pod's code after a SIGTERM (saved or
unsaved preemption), a permanent failure that stopped the launcher, and why
the previous in-place round failed. The launcher (launch.py) and its workers
(worker.py, in_process.py) all use them, so they live here, below both: neither
imports the other for them.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from torchfleet_contract import pod as contract
from torchfleet_contract.pod import ExitCodePolicy, in_place_restarts_left

EXIT_CONFIG = 2
# 128 + SIGTERM, as a shell reports a terminated process: the gang was
# preempted and a checkpoint of the step it stopped at was saved (not success).
EXIT_PREEMPTED = 143
# Stopped on SIGTERM without saving: no checkpoint directory, checkpoints
# disabled or saveOnSigterm off, or a worker that died before it could save.
# Above every 128 + signal code (Linux has 64 signals) so it is never read as
# one, and >= 128 so the operator's ExitCode policy retries it as the
# disruption it is; the new gang starts from the last checkpoint, if any.
EXIT_PREEMPTED_UNSAVED = 200
# Each worker's exit code, in the launcher's temporary directory (worker.py).
# Named by the agent's round (torchelastic's restart count) and local rank:
# round-<R>.rank-<local>.exit. The next round's workers read the failed round's
# to say why it failed; a stopped launcher reads the newest round's.
OUTCOME_GLOB = "round-*.rank-*.exit"
# Too many consecutive non-finite steps (training.maxNonFiniteSteps): a
# permanent failure under the operator's ExitCode policy.
EXIT_DIVERGED = 3
# A collective of the preflight check failed or timed out (preflight.enabled):
# the pod contract's, since the operator names it in the Preflight condition.
EXIT_PREFLIGHT_FAILED = contract.EXIT_PREFLIGHT_FAILED
# A collective timed out waiting on a peer, or lost one (its connection reset):
# the gang, not this rank, is broken (timeouts.py sets the timeout). >= 128 so
# the operator's ExitCode policy retries it; the next gang or in-place round
# resumes from the last checkpoint. Each rank that sees it logs one line naming
# itself, the timeout and torch's message.
EXIT_COLLECTIVE_FAILED = contract.EXIT_COLLECTIVE_FAILED


def preempted_exit_code(outcomes: Path | None, workers: int) -> int:
    """143 only when every one of this pod's ``workers`` reported a saved
    checkpoint; a worker with no report was stopped before it could save."""
    rounds = {_round_of(path) for path in outcomes.glob(OUTCOME_GLOB)} if outcomes else set()
    codes = list(round_outcomes(outcomes, max(rounds)).values()) if outcomes and rounds else []
    if len(codes) == workers and all(code == EXIT_PREEMPTED for code in codes):
        return EXIT_PREEMPTED
    return EXIT_PREEMPTED_UNSAVED


def permanent_failure(outcomes: Path) -> int | None:
    """A code the run policy does not retry among the newest round's reports: a
    worker that exited with it stopped this launcher (stop_launcher_if_permanent)."""
    rounds = {_round_of(path) for path in outcomes.glob(OUTCOME_GLOB)}
    if not rounds:
        return None
    policy = ExitCodePolicy.from_env()
    for code in round_outcomes(outcomes, max(rounds)).values():
        if code not in (None, 0, EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED) and not policy.retries(
            code
        ):
            return code
    return None


def stop_launcher_if_permanent(code: int, launcher_pid: int) -> None:
    """In a worker its agent would restart after a failure: when the run policy
    does not retry ``code``, stop the launcher (SIGTERM: its agent stops the
    other workers, it exits with this code) rather than retry in place what the
    operator would not retry as a gang."""
    if code in (0, EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED) or in_place_restarts_left() <= 0:
        return
    policy = ExitCodePolicy.from_env()
    if policy.retries(code):
        return
    print(
        f"torchfleet-train: exit code {code} is permanent under restartPolicy "
        f"{policy.restart_policy}: stopping the launcher instead of restarting in place",
        file=sys.stderr,
        flush=True,
    )
    os.kill(launcher_pid, signal.SIGTERM)


def write_outcome(outcomes: Path, local_rank: int, code: int, round_: int = 0) -> None:
    # By local rank: an elastic job's global ranks change from round to round.
    (outcomes / f"round-{round_}.rank-{local_rank}.exit").write_text(str(code))


def round_outcomes(outcomes: Path, round_: int) -> dict[int, int | None]:
    """The codes this pod's workers of ``round_`` reported, by local rank."""
    found = {}
    for path in outcomes.glob(f"round-{round_}.rank-*.exit"):
        local = path.name.removesuffix(".exit").rpartition("rank-")[2]
        found[int(local)] = _read_code(path)
    return found


def _round_of(path: Path) -> int:
    return int(path.name.split(".", 1)[0].removeprefix("round-"))


def failed_round_reason(outcomes: Path, round_: int, workers: int) -> str | None:
    """Why this pod's workers of the failed ``round_`` ended, as far as they could
    say (one of contract.RESTART_REASONS): a worker that left no report died by a
    signal or crashed; one that lost its peer says so; any other code is the
    program's own failure."""
    codes = round_outcomes(outcomes, round_)
    if len(codes) < workers or None in codes.values():
        return contract.RESTART_REASON_WORKER_KILLED
    if any(code not in (0, EXIT_COLLECTIVE_FAILED) for code in codes.values()):
        return contract.RESTART_REASON_WORKER_FAILED
    if EXIT_COLLECTIVE_FAILED in codes.values():
        return contract.RESTART_REASON_PEER_LOST
    return None


def _read_code(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
