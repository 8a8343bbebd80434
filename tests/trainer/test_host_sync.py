"""The loop never waits on the device between log steps, nor more than once per
evaluation.

A host sync is found by what it does, not by the name of the call that did it:
every scalar read (``item``, ``tolist``, ``numpy``, ``float()``, ``int()``,
``bool()``, and aten's ``_local_scalar_dense`` and ``nonzero``, which C++ code
reaches without a Python call) and every copy between host and device that is
not ``non_blocking`` (``.cpu()``, ``.to("cpu")``, a ``.to`` or ``copy_`` across
device types). On a CPU-only machine host and device are one: a move to the
device is a no-op there, so a copy to the host shows by naming it (``.cpu()``,
``"cpu"``); ``.to(torch.device("cpu"))`` is caught on a GPU only.

The trainer runs on the launcher's path (a one-rank process group, bf16, the
Prometheus metrics and TensorBoard curves on), with gradient accumulation and
evaluations, each call attributed to the step, settling or evaluation it ran
in: steps have none, each settling step (its batch of losses and gradient norms
in one transfer) and each evaluation (its losses summed on the device) one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.test_overhead_guards import BF16
from torchfleet_contract.trainer_config import load_config
from torchfleet_trainer.metrics import TrainMetrics
from torchfleet_trainer.train import Trainer, build_runtime

pytestmark = pytest.mark.trainer

STEPS, LOG_EVERY, EVAL_EVERY, ACCUM, EVAL_BATCHES = 12, 4, 6, 2, 3
CONFIG = [
    *BF16,
    f"training.gradAccumSteps={ACCUM}",
    f"training.steps={STEPS}",
    f"training.logInterval={LOG_EVERY}",
    f"training.evalInterval={EVAL_EVERY}",
    f"training.evalBatches={EVAL_BATCHES}",
    "metrics.enabled=true",
    "tensorboard.enabled=true",
]
SCALAR_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
    torch.Tensor.__array__,
}
# aten ops whose result the host must wait for, also when C++ code calls them.
SYNCING_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}


def crosses(tensor: torch.Tensor, target: Any) -> bool:
    """Whether moving ``tensor`` to ``target`` copies between host and device: a
    target of another device type, or the host named as such (``"cpu"``; here the
    device is the host too, so only the name shows the intent)."""
    if isinstance(target, str):
        return torch.device(target).type == "cpu" or torch.device(target).type != tensor.device.type
    if isinstance(target, torch.device | torch.Tensor):
        return (target.type if isinstance(target, torch.device) else target.device.type) != (
            tensor.device.type
        )
    return False


def blocking_copy(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A copy between host and device that the host waits for."""
    if func is torch.Tensor.cpu:
        return True
    if kwargs.get("non_blocking") or any(a is True for a in args[1:]):
        return False
    if func is torch.Tensor.copy_:
        return crosses(args[1], args[0].device)
    if func is torch.Tensor.to:
        return any(crosses(args[0], t) for t in (*args[1:], kwargs.get("device")))
    return False


class HostSyncs(TorchFunctionMode):
    """Records each host sync under the label of the region it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.where = "outside steps"
        self.seen: list[tuple[str, str]] = []
        self.inside_recorded = False

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self.inside_recorded or not (func in SCALAR_READS or blocking_copy(func, args, kwargs)):
            return func(*args, **kwargs)
        self.seen.append((self.where, getattr(func, "__name__", str(func))))
        # Its own aten ops are this one sync, not more.
        self.inside_recorded = True
        try:
            return func(*args, **kwargs)
        finally:
            self.inside_recorded = False

    @contextmanager
    def region(self, label: str) -> Iterator[None]:
        outer, self.where = self.where, label
        try:
            yield
        finally:
            self.where = outer


class AtenSyncs(TorchDispatchMode):
    """The syncs no Python call shows (aten's own scalar reads)."""

    def __init__(self, calls: HostSyncs) -> None:
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in SYNCING_OPS and not self.calls.inside_recorded:
            self.calls.seen.append((self.calls.where, str(func)))
        return func(*args, **(kwargs or {}))


def in_region(trainer: Trainer, syncs: HostSyncs, name: str, label: Callable[..., str]) -> None:
    original = getattr(trainer, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with syncs.region(label(*args)):
            return original(*args, **kwargs)

    setattr(trainer, name, wrapped)


def test_steps_have_no_host_sync_settling_steps_and_evaluations_one(
    one_rank: None, tmp_path: Path
) -> None:
    config = load_config(overrides=[*CONFIG, f"tensorboard.dir={tmp_path}"], env={})
    trainer = Trainer(config, build_runtime(config), TrainMetrics())
    syncs = HostSyncs()
    in_region(trainer, syncs, "_step", lambda step: f"step {step}")
    in_region(trainer, syncs, "_settle", lambda pending, *_: f"settle {pending[-1].step}")
    in_region(trainer, syncs, "evaluate", lambda step: f"evaluate {step}")
    eval_rows: list[int] = []
    eval_loss = trainer.model.eval_loss

    def counting_rows(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        eval_rows.append(inputs.shape[0])
        return eval_loss(inputs, targets)

    trainer.model.eval_loss = counting_rows
    with syncs, AtenSyncs(syncs):
        result = trainer.run()

    assert result.status == "completed" and result.last_step == STEPS
    assert sorted(result.eval_losses) == [6, 12]
    settling = sorted({*range(LOG_EVERY, STEPS + 1, LOG_EVERY), EVAL_EVERY})
    expected = Counter({f"settle {s}": 1 for s in settling})
    expected.update({f"evaluate {s}": 1 for s in (6, 12)})
    found = Counter(where for where, _ in syncs.seen)
    assert found == expected, f"host syncs by region (expected {dict(expected)}): {syncs.seen}"
    # Evaluation runs in the training micro-batch (what memory allows), not smaller.
    micro = config.training.global_batch_size // ACCUM
    assert eval_rows == [micro] * (2 * EVAL_BATCHES * ACCUM), eval_rows
    # Every step is still reported, with its own loss, once settled.
    assert [r["step"] for r in result.history] == list(range(1, STEPS + 1))
    assert len({r["loss"] for r in result.history}) == STEPS
    assert trainer.metrics is not None
    assert trainer.metrics.registry.get_sample_value("torchfleet_train_step") == STEPS
    assert list(tmp_path.glob("events.out.tfevents.*")), "TensorBoard wrote no event file"
