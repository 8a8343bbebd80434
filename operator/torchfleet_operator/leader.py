"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection.

With two replicas, one leads: only its workers, resync and progress poller
run, so only it writes. The other keeps kopf's caches warm and takes over when
the lease expires. Timing follows client-go's defaults (lease 15 s, renew
deadline 10 s, retry every 2 s); expiry is judged on the candidate's own
monotonic clock from when it last saw the record change, never by comparing
the holder's wall-clock renewTime with ours (clock skew between nodes).

A leader that cannot renew within the deadline stops leading, and the process
exits (controller-runtime does the same): a pass already running could
otherwise still write after another replica took over. Noticing takes a
moment, though: a process frozen past its lease (SIGSTOP, a VM paused, a long
GC pause) wakes with its passes and its renew loop ready together, and a pass
can write first. So every write of the reconciler is fenced on this replica's
own clock (``holds_lease``): none goes out once the renew deadline has passed
since the last renewal that began before it, however late the loop notices.
A leader that shuts down cleanly releases the lease, so its successor need not
wait for expiry.

``next_record`` decides; ``LeaderElector`` only reads and writes the Lease.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchfleet_operator import metrics
from torchfleet_operator.kube import RawApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec: who holds it, for how long, since when."""

    holder: str | None
    duration_seconds: int
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder=spec.get("holderIdentity") or None,
            duration_seconds=duration if isinstance(duration, int) and duration > 0 else 15,
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=transitions if isinstance(transitions, int) else 0,
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


def next_record(
    current: LeaseRecord | None,
    unchanged_since: float,
    me: str,
    now: float,
    stamp: str,
    duration_seconds: int,
) -> LeaseRecord | None:
    """The record that makes (or keeps) ``me`` the holder, or None: another holds it.

    ``unchanged_since`` is when (monotonic, our clock) we first saw ``current``
    as it is; ``now`` is our monotonic clock, ``stamp`` our wall clock for the
    record's times.
    """
    if current is None or current.holder is None:  # free, or released
        transitions = current.transitions + 1 if current is not None else 0
        return LeaseRecord(me, duration_seconds, stamp, stamp, transitions)
    if current.holder == me:
        return replace(current, duration_seconds=duration_seconds, renew_time=stamp)
    if unchanged_since + current.duration_seconds > now:
        return None  # another holder renewed within its lease, as far as we saw
    return LeaseRecord(me, duration_seconds, stamp, stamp, current.transitions + 1)


def released(current: LeaseRecord, me: str) -> LeaseRecord | None:
    """The record that gives the lease up, or None when ``me`` does not hold it."""
    if current.holder != me:
        return None
    return replace(current, holder=None, duration_seconds=1)


@dataclass(frozen=True)
class ElectionTiming:
    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        # client-go's own checks: a leader must be able to retry before it
        # gives up, and give up before another replica may take over.
        if not self.lease_seconds > self.renew_deadline_seconds > self.retry_seconds > 0:
            raise ValueError(
                "leader election needs lease > renew deadline > retry period > 0, got "
                f"{self.lease_seconds} / {self.renew_deadline_seconds} / {self.retry_seconds}"
            )


class LeaderElector:
    """Campaigns for one Lease, then keeps renewing it (blocking calls in threads)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timing: ElectionTiming,
    ) -> None:
        # Not counted in the reconciler's API metrics: those say what the jobs cost.
        self.raw = RawApi(api, counted=False)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timing = timing
        self.leading = False
        self._seen: tuple[LeaseRecord | None, float] = (None, 0.0)
        # Monotonic time at which the last successful acquire or renew began:
        # the lease is ours for the renew deadline from then, by our own clock.
        self._renewed = -math.inf

    def holds_lease(self) -> bool:
        """Whether this replica may still write: it leads, and by its own clock
        the renew deadline has not passed since its last renewal began (which a
        rival's take-over, a lease duration after it last saw a change, cannot
        precede)."""
        return (
            self.leading and time.monotonic() - self._renewed < self.timing.renew_deadline_seconds
        )

    @property
    def _collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    async def run(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> None:
        """Returns only after leadership was won and then lost (on_stopped called)."""
        log.info("waiting to lead %s/%s as %s", self.namespace, self.name, self.identity)
        while not await self._try():
            await asyncio.sleep(self.timing.retry_seconds * random.uniform(1.0, 1.2))
        self.leading = True
        log.info("leading %s/%s as %s", self.namespace, self.name, self.identity)
        on_started()
        renewed = time.monotonic()
        while time.monotonic() - renewed < self.timing.renew_deadline_seconds:
            await asyncio.sleep(self.timing.retry_seconds)
            if await self._try():
                renewed = time.monotonic()
        self.leading = False
        metrics.LEADER.set(0)
        log.error(
            "lost the lease %s/%s: no renewal for %.0fs",
            self.namespace,
            self.name,
            self.timing.renew_deadline_seconds,
        )
        on_stopped()

    async def _try(self) -> bool:
        try:
            return await asyncio.to_thread(self._acquire_or_renew)
        except Exception as exc:  # an unreachable apiserver is a failed try, nothing more
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def _acquire_or_renew(self) -> bool:
        now, stamp = time.monotonic(), _stamp()
        lease = self._read()
        current = None if lease is None else LeaseRecord.from_spec(lease.get("spec"))
        seen, since = self._seen
        if seen != current:
            self._seen = (current, now)
            since = now
        record = next_record(current, since, self.identity, now, stamp, self.timing.lease_seconds)
        if record is None:
            return False
        if not self._write(lease, record):
            return False
        self._renewed = now
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            found = self.raw.request("GET", f"{self._collection}/{self.name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    def _write(self, lease: dict[str, Any] | None, record: LeaseRecord) -> bool:
        """Creates or replaces the Lease; False when another candidate wrote first
        (409: the resourceVersion we read is stale, or it was created meanwhile)."""
        metadata: dict[str, Any] = {"name": self.name}
        if lease is not None:
            read = lease.get("metadata") or {}
            metadata["resourceVersion"] = read.get("resourceVersion")
            # A replace drops what it does not carry: the chart's labels and
            # annotations (Helm's ownership of the Lease) stay as they were.
            for kept in ("labels", "annotations", "ownerReferences"):
                if read.get(kept):
                    metadata[kept] = read[kept]
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.to_spec(),
        }
        try:
            if lease is None:
                self.raw.request("POST", self._collection, body)
            else:
                self.raw.request("PUT", f"{self._collection}/{self.name}", body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def release(self) -> None:
        """Gives the lease up (clean shutdown), so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        metrics.LEADER.set(0)
        try:
            lease = self._read()
            if lease is None:
                return
            record = released(LeaseRecord.from_spec(lease.get("spec")), self.identity)
            if record is not None and self._write(lease, record):
                log.info("released the lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # it expires on its own
            log.warning("could not release the lease %s/%s: %s", self.namespace, self.name, exc)


def _stamp() -> str:
    """A MicroTime, as the Lease's acquireTime and renewTime are."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
