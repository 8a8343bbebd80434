"""Held where an e2e test injects its fault: barriers the trainer meets.

A test that injects a fault "after X" (a checkpoint saved, a step logged) puts
this folder first on its job's PYTHONPATH and names the points in
``E2E_HOLD_AT``, a comma-separated list: ``checkpoint:20`` (once the trainer
has logged the save of step 20 or later), ``step:60`` (once it has logged step
60 or later), ``before-eval:2`` and ``before-save:2`` (as the trainer enters
the evaluation or the save of step 2 or later). Python imports this module at
start-up in every process of the pod. At a ``before-`` point, the pod's trainer
process waits as it enters the evaluation or save: its peers go on into that
phase and wait for it in its first collective, so they are held inside the
phase, not near it (tests/trainer/test_phase_export.py). At a logged point, in
the rank that logs (whose ``log_json`` lines the pod's log carries),
right after the line of a point's event, its main thread waits: it writes
``held-<i>`` (point i's event, as JSON) into ``E2E_HOLD_DIR`` and waits for the
test to write ``release-<i>`` there. Its peers wait for it in their next
collective; its other threads (the /metrics server) go on. A SIGTERM that
comes while it is held is noted in ``sigterm-<i>`` and passed on to the
trainer's handler (which only sets its stop flag: the trainer acts on it after
the release), so a test can release a preempted trainer once it has the signal.

Each point holds once: a later gang of the same job finds ``held-<i>`` there
and goes on. A barrier, not a poll: however fast the machine, nothing of the
run after X happens before the test has injected its fault and let go. Nothing
here stands in for the trainer: it only pauses its main thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

HOLD_AT = "E2E_HOLD_AT"
HOLD_DIR = "E2E_HOLD_DIR"
LOGGED = ("checkpoint", "step")
# Held as the trainer enters one of its methods: kind -> Trainer method, whose
# first argument is the step.
ENTERED = {"before-eval": "evaluate", "before-save": "save"}
KINDS = (*LOGGED, *ENTERED)
# The trainer's log module and its function log_json(event, **fields), which
# writes the JSON lines.
LOG_MODULE = "torchfleet_trainer.metrics"
LOG_FUNCTION = "log_json"
# The module and class whose methods ENTERED names.
TRAIN_MODULE = "torchfleet_trainer.train"
TRAINER_CLASS = "Trainer"


def parse(value: str) -> list[tuple[str, int]]:
    """``checkpoint:20,step:60`` -> [("checkpoint", 20), ("step", 60)]."""
    points = []
    for point in value.split(","):
        kind, _, step = point.strip().partition(":")
        if kind not in KINDS or not step.isdigit():
            raise ValueError(
                f"{HOLD_AT}={value!r}: want points like checkpoint:20, step:60 or before-eval:2"
            )
        points.append((kind, int(step)))
    return points


def _write_json(path: str, record: dict[str, Any]) -> None:
    import json

    with open(path + ".tmp", "w") as out:
        json.dump(record, out)
    os.replace(path + ".tmp", path)  # whole or absent: the test reads it at once


def _hold(folder: str, index: int, record: dict[str, Any]) -> None:
    import signal
    import time

    held = os.path.join(folder, f"held-{index}")
    release = os.path.join(folder, f"release-{index}")
    trainers = signal.getsignal(signal.SIGTERM)

    def noted(signum: int, frame: Any) -> None:
        _write_json(os.path.join(folder, f"sigterm-{index}"), {"time": time.time()})
        if callable(trainers):
            trainers(signum, frame)

    signal.signal(signal.SIGTERM, noted)
    try:
        _write_json(held, {**record, "pid": os.getpid(), "time": time.time()})
        while not os.path.exists(release):
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, trainers)


def _hold_at_first(
    points: list[tuple[str, int]], folder: str, event: str, step: Any, fields: dict[str, Any]
) -> None:
    """Holds at the first point not yet held that ``event`` at ``step`` reaches."""
    for index, (kind, at) in enumerate(points):
        done = os.path.exists(os.path.join(folder, f"held-{index}"))
        if event == kind and isinstance(step, int) and step >= at and not done:
            os.makedirs(folder, exist_ok=True)
            _hold(folder, index, {"event": event, **fields})
            return


def holding(
    log_json: Callable[..., None], points: list[tuple[str, int]], folder: str
) -> Callable[..., None]:
    """``log_json`` that, after a point's line, holds until the test releases it."""

    def log_json_then_hold(event: str, **fields: Any) -> None:
        log_json(event, **fields)
        _hold_at_first(points, folder, event, fields.get("step"), fields)

    return log_json_then_hold


def held_on_entry(
    method: Callable[..., Any], kind: str, points: list[tuple[str, int]], folder: str
) -> Callable[..., Any]:
    """A Trainer ``method(self, step, ...)`` that first holds at a ``kind`` point."""
    import functools

    @functools.wraps(method)
    def hold_then_run(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        _hold_at_first(points, folder, kind, step, {"step": step})
        return method(self, step, *args, **kwargs)

    return hold_then_run


def _wrap(module: Any, points: list[tuple[str, int]], folder: str) -> None:
    if module.__name__ == LOG_MODULE:
        log_json = getattr(module, LOG_FUNCTION)
        setattr(module, LOG_FUNCTION, holding(log_json, points, folder))
        return
    trainer = getattr(module, TRAINER_CLASS)
    for kind, name in ENTERED.items():
        setattr(trainer, name, held_on_entry(getattr(trainer, name), kind, points, folder))


def _install(points: list[tuple[str, int]], folder: str) -> None:
    """Wraps log_json as soon as its module is loaded, before train.py binds it,
    and the Trainer's entered methods as soon as train.py is."""
    import importlib.abc
    import importlib.machinery
    import sys
    from types import ModuleType

    class Loader(importlib.abc.Loader):
        def __init__(self, inner: importlib.abc.Loader) -> None:
            self.inner = inner

        def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
            return self.inner.create_module(spec)

        def exec_module(self, module: ModuleType) -> None:
            self.inner.exec_module(module)
            _wrap(module, points, folder)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(
            self, name: str, path: Any, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            if name not in (LOG_MODULE, TRAIN_MODULE):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, Finder())


def _from_env() -> None:
    value = os.environ.get(HOLD_AT)
    if not value:
        return
    folder = os.environ.get(HOLD_DIR)
    if not folder:
        raise ValueError(f"{HOLD_AT} is set but {HOLD_DIR} is not")
    _install(parse(value), folder)


_from_env()
