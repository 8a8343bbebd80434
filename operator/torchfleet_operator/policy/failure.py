"""Which failures restart the gang, which fail the job, and how long to wait.

A pod taken away by the platform (evicted, preempted, its node lost, deleted
under a running gang) is never the code's fault: always retryable, and a
*disruption* that does not count toward backoffLimit (JobSet's
RestartJobSetAndIgnoreMaxRestarts, the Job controller's podFailurePolicy
Ignore for DisruptionTarget). A pod that never started (kubelet admission) is
the node's fault: retryable, but counted, since it may recur for ever. A pod
that exited is classified by the job's runPolicy: explicit exit-code lists
first, then restartPolicy (OnFailure: retry; Never: fail; ExitCode: 1-127 are
the program's own errors and fail, 128+ are signals such as OOM kill and retry).

When several pods fail in one batch, the first to fail (by finishedAt) decides:
an OOM-killed rank takes its peers down with exit 1, and those exits are
consequences. finishedAt has one-second resolution, so within one second a
retryable failure is taken as the cause; pods without a finishedAt (taken away,
not exited) come after those that exited.

Kubelets report on their own schedules, so a batch can arrive in pieces: the
peers' exit 1 first, the OOM kill that caused them a few seconds later. A
failure that would end the job therefore waits (``settle_left``) until the
gang's other pods have ended too, or for a bounded time after it ended; one
that restarts the gang is decided at once, as waiting cannot make it worse.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

# Exit codes from 128 up mean "killed by signal (code - 128)": 137 = SIGKILL
# (often the OOM killer), 143 = SIGTERM (preemption, drain).
FIRST_SIGNAL_EXIT_CODE = 128


@dataclass(frozen=True)
class Failure:
    """One reason the current gang cannot go on."""

    pod: str
    reason: str  # PodFailed, Evicted, NodeLost, PodDeleted, ...
    exit_code: int | None
    retryable: bool
    message: str
    disruption: bool = False  # the platform took the pod: not counted toward backoffLimit
    finished_at: datetime | None = None

    def describe(self) -> str:
        code = f" with exit code {self.exit_code}" if self.exit_code is not None else ""
        detail = f": {self.message}" if self.message else ""
        return f"pod {self.pod} {self.reason}{code}{detail}"


def exit_is_retryable(
    restart_policy: str,
    exit_code: int | None,
    retryable_codes: Collection[int] = (),
    permanent_codes: Collection[int] = (),
) -> bool:
    if exit_code is not None and exit_code in permanent_codes:
        return False
    if exit_code is not None and exit_code in retryable_codes:
        return True
    if restart_policy == "Never":
        return False
    if restart_policy == "ExitCode":
        # No exit code (e.g. the container never started): not the program's verdict.
        return exit_code is None or exit_code >= FIRST_SIGNAL_EXIT_CODE
    return True  # OnFailure


def first_failure(failures: Collection[Failure]) -> Failure:
    """The failure that caused the batch (see the module docstring)."""
    return min(
        failures,
        key=lambda f: (
            f.finished_at is None,
            f.finished_at or datetime.max.replace(tzinfo=None),
            not f.retryable,
        ),
    )


def settle_left(failures: Collection[Failure], now: datetime, settle_seconds: float) -> float:
    """Seconds to wait before a job-ending decision on ``failures`` (0: decide).

    Counted from the earliest exit among them, so a batch that trickled in is
    judged once its first failure is ``settle_seconds`` old; never more than
    ``settle_seconds`` from now, whatever the kubelet's clock said.
    """
    ended = [f.finished_at for f in failures if f.finished_at is not None]
    if not ended:
        return 0.0
    waited = (now - min(ended)).total_seconds()
    return min(settle_seconds, max(0.0, settle_seconds - waited))


def restart_backoff(restarts_so_far: int, base: float, cap: float) -> float:
    """Seconds to wait before starting gang number ``restarts_so_far + 1``."""
    if base <= 0:
        return 0.0
    # min() before the power keeps huge restart counts from overflowing.
    return min(cap, base * 2 ** min(restarts_so_far, 32))
