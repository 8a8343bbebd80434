"""`kubectl get tj -o wide` on a real API server: the wide columns (loss,
validation loss, checkpoint, tokens/s, MFU, goodput; spec.managedBy) show a
status the operator's own code produced, and the plain table keeps its columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest

from tests.fixtures.api import TrainingJobs
from tests.unit.api.cases import job
from torchfleet_operator.api import parse_training_job
from torchfleet_operator.status import goodput
from torchfleet_operator.status.progress import progress_from_metrics
from torchfleet_trainer.metrics import TrainMetrics

pytestmark = pytest.mark.cluster

T0 = datetime(2026, 11, 20, 23, 0, 0, tzinfo=UTC)


def scraped_progress() -> tuple[dict[str, Any], int | None]:
    """status.progress as the operator parses it from the trainer's own registry."""
    trainer = TrainMetrics()
    trainer.step.set(420)
    trainer.total_steps.set(1000)
    trainer.loss.set(1.93)
    trainer.eval_loss.set(2.05)
    trainer.tokens_per_second.set(51234.5)
    trainer.mfu.set(0.41)
    trainer.step_seconds.observe(0.5)  # the trainer times each step it reports
    trainer.checkpoint_step.set(400)
    trainer.checkpoint_save_seconds.observe(3.0)
    return progress_from_metrics(generate_latest(trainer.registry).decode(), "2026-11-20T23:10:00Z")


def accounted(progress: dict[str, Any], checkpoint: int | None) -> dict[str, Any]:
    """A time account from the real accounting: queued 10 s, then a restart at 300 s."""
    account = None
    phases = [(0, "Pending", False), (10, "Running", False), (300, "Restarting", True)]
    phases += [(330, "Running", False), (600, "Running", False)]
    before: str | None = None
    for t, phase, ended in phases:
        account = goodput.account(
            account,
            phase_before=before,
            phase_now=phase,
            gang_ended=ended,
            progress=progress,
            checkpoint_step=checkpoint,
            now=T0 + timedelta(seconds=t),
            created=T0,
            status_changed=True,
        )
        before = phase
    assert account is not None
    return account


def test_wide_columns_show_losses_checkpoint_throughput_mfu_and_goodput(
    cluster: Any, trainingjobs: TrainingJobs, namespace: str
) -> None:
    trainingjobs.create(namespace, job("wide", {"worker": {"replicas": 3}}))
    progress, checkpoint = scraped_progress()
    assert progress is not None
    account = accounted(progress, checkpoint)
    fraction = goodput.goodput(account)
    status = {
        "phase": "Running",
        "nodesReady": "4/4",
        "restartCount": 1,
        "restarts": 1,  # what the Restarts column shows: gang plus in-place restarts
        "progress": progress,
        "lastCheckpoint": {"step": checkpoint},
        "timeAccounting": account,
        "goodput": fraction,
    }
    body = json.dumps([{"op": "add", "path": "/status", "value": status}])
    patch = ("patch", "tj", "wide", "-n", namespace, "--subresource=status", "--type=json")
    expected = ["wide", "Running", "4/4", "1", "42", "1.93", "2.05", "400", "51234.5", "0.41"]
    expected.append(str(fraction))  # then Managed-By, empty: no spec.managedBy
    # An operator under test elsewhere may write its own status between our
    # write and our read: the stored status is checked in the patch's own
    # response, and the table is retried after a fresh write.
    for _attempt in range(5):
        written = json.loads(cluster.kubectl(*patch, "-p", body, "-o", "json").stdout)
        stored = parse_training_job(written).status
        assert stored is not None and stored.goodput == fraction
        assert stored.time_accounting is not None
        assert stored.time_accounting.recomputed_seconds == account["recomputedSeconds"] > 0
        assert written["status"]["progress"] == progress  # nothing pruned by the schema
        wide = cluster.kubectl("get", "tj", "wide", "-n", namespace, "-o", "wide").stdout
        table = wide.splitlines()
        if table[1].split()[: len(expected)] == expected:
            break
    else:
        pytest.fail(f"the wide columns never showed the status: {table}")
    header = ["NAME", "PHASE", "NODES", "RESTARTS", "PROGRESS"]
    wide_header = ["LOSS", "VAL-LOSS", "CHECKPOINT", "TOKENS/S", "MFU", "GOODPUT", "MANAGED-BY"]
    wide_header.append("AGE")
    assert table[0].split() == [*header, *wide_header]
    plain = cluster.kubectl("get", "tj", "wide", "-n", namespace).stdout.splitlines()
    assert plain[0].split() == [*header, "AGE"]  # priority 1: -o wide only
