"""activeDeadlineSeconds: measured from the first start, restarts included."""

from __future__ import annotations

from datetime import datetime


def seconds_left(
    start: datetime | None, deadline_seconds: int | None, now: datetime
) -> float | None:
    """None when no deadline applies; <= 0 when it has passed."""
    if deadline_seconds is None or start is None:
        return None
    return deadline_seconds - (now - start).total_seconds()
