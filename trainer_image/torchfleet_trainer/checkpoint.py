"""Distributed checkpoints: atomic, resumable across layouts, keeping the last K.

Layout under the checkpoint directory::

    step-00000020/        complete: DCP shards, .metadata and the COMPLETE marker
    step-00000030.partial/ being written (or the save was killed): never loaded

Ranks write their shards into ``step-N.partial``; once every rank's write has
finished, rank 0 writes ``COMPLETE`` and renames the directory, so a
checkpoint is either whole and marked or ignored. Parameters and optimizer
state are saved under their unsplit names (``layers.3.attention.wq.weight``),
as DCP's state-dict helpers give them for any mix of FSDP, TP and PP, so a
checkpoint loads into any other layout or world size: DCP reshards on load.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.optim import Optimizer

from torchfleet_contract.trainer_config import CheckpointConfig

MARKER = "COMPLETE"
WRITER_THREADS = 4
_STEP_DIR = re.compile(r"^step-(\d+)$")
# Flat optimizer state keyed by parameter name: the same keys in every layout,
# and pipeline ranks' dicts merge by plain union.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint with its completion marker, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and (entry / MARKER).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_complete(root: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def prune(root: Path, keep_last: int) -> list[Path]:
    """Deletes complete checkpoints beyond the newest ``keep_last`` and stale partial ones."""
    complete = complete_checkpoints(root)
    doomed = [path for _, path in complete[:-keep_last]]
    newest = complete[-1][0] if complete else -1
    for entry in root.glob("step-*.partial"):
        match = re.match(r"^step-(\d+)\.partial$", entry.name)
        if match and int(match.group(1)) <= newest:
            doomed.append(entry)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


@dataclass
class PendingSave:
    step: int
    partial: Path
    future: Future[Any]
    finalized: bool = False


class Checkpointer:
    """Saves and loads this rank's share of model, optimizer and train state."""

    def __init__(
        self,
        root: Path,
        config: CheckpointConfig,
        parts: list[nn.Module],
        optimizers: Sequence[Optimizer],
        on_complete: Callable[[int], None] | None = None,
    ) -> None:
        self.root = root
        self.config = config
        self.parts = parts
        self.optimizers = optimizers
        self.is_rank0 = dist.get_rank() == 0
        self.pending: PendingSave | None = None
        # Told the step of each checkpoint once it is complete (for metrics).
        self.on_complete = on_complete
        # Async saves run collectives from a background thread; a gloo group
        # of their own keeps them apart from the training collectives.
        self.async_group: Any = dist.new_group(backend="gloo") if config.async_save else None
        # One stager for the whole run: it keeps the host copies (pinned on CUDA)
        # between saves instead of allocating them each time, and copies on a
        # thread of its own while the next step computes.
        self.stager = _async_stager() if config.async_save else None
        # Set while an async save is still copying the state to the host.
        self.staging: Future[None] | None = None

    def state_dict(self, train_state: dict[str, Any]) -> dict[str, Any]:
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            model.update(get_model_state_dict(part, options=_OPTIONS))
            optim.update(get_optimizer_state_dict(part, opt, options=_OPTIONS))
        return {"model": model, "optimizer": optim, "train": dict(train_state)}

    def save(self, step: int, train_state: dict[str, Any], force_sync: bool = False) -> float:
        """Saves step ``step``; returns seconds the caller was blocked."""
        start = time.perf_counter()
        self.wait()
        partial = self.root / f"step-{step:08d}.partial"
        if self.is_rank0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier()
        state = self.state_dict(train_state)
        if self.stager is not None and not force_sync:
            response = dcp.async_save(
                state,
                storage_writer=_writer(partial),
                process_group=self.async_group,
                async_stager=self.stager,
            )
            assert isinstance(response, AsyncSaveResponse)
            self.staging = response.staging_completion
            self.pending = PendingSave(step, partial, response.upload_completion)
        else:
            dcp.save(state, storage_writer=_writer(partial))
            dist.barrier()
            self._finalize(step, partial)
        return time.perf_counter() - start

    def wait_for_staging(self) -> None:
        """Blocks until an async save's host copy is taken; call it before the
        optimizer changes the parameters that save is copying."""
        if self.staging is not None:
            staging, self.staging = self.staging, None
            staging.result()

    def close(self) -> None:
        """Frees the stager's host copies (after the last save has been waited for)."""
        if self.stager is not None:
            self.stager.close()
            self.stager = None

    def poll(self) -> None:
        """Marks an async save complete as soon as rank 0's part is done, without
        blocking: rank 0 writes the metadata only after every rank reported its
        shards written, so its future finishing means the whole save is on disk."""
        pending = self.pending
        if pending and self.is_rank0 and not pending.finalized and pending.future.done():
            pending.future.result()  # re-raises a failed save
            self._finalize(pending.step, pending.partial)
            pending.finalized = True

    def wait(self) -> None:
        """Blocks until an async save in flight is written and marked."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        self.wait_for_staging()
        pending.future.result()
        dist.barrier()
        if not pending.finalized:
            self._finalize(pending.step, pending.partial)

    def _finalize(self, step: int, partial: Path) -> None:
        if self.is_rank0:
            marker = {"step": step, "world_size": dist.get_world_size(), "time": time.time()}
            (partial / MARKER).write_text(json.dumps(marker))
            final = step_dir(self.root, step)
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            prune(self.root, self.config.keep_last)
        if self.on_complete:
            self.on_complete(step)

    def load_latest(self, train_state: dict[str, Any]) -> tuple[int, float] | None:
        """Loads the newest complete checkpoint into the parts, optimizers and
        ``train_state`` (updated in place); returns (step, seconds) or None."""
        choice: list[str | None] = [None]
        if self.is_rank0:
            latest = latest_complete(self.root)
            choice[0] = str(latest[1]) if latest else None
        # Every rank must load the same one, whatever its view of the directory.
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return None
        start = time.perf_counter()
        state = self.state_dict(train_state)
        dcp.load(state, checkpoint_id=choice[0])
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            set_model_state_dict(part, state["model"], options=_strict_false())
            set_optimizer_state_dict(part, opt, state["optimizer"], options=_OPTIONS)
        train_state.update(state["train"])
        return int(state["train"]["step"]), time.perf_counter() - start


def _async_stager() -> DefaultStager:
    cuda = torch.cuda.is_available()
    options = StagingOptions(
        use_pinned_memory=cuda,
        use_shared_memory=False,
        use_async_staging=True,
        use_non_blocking_copy=cuda,
    )
    return DefaultStager(options)


def _writer(path: Path) -> FileSystemWriter:
    # Several writer threads per rank: one thread leaves most of the disk's
    # bandwidth unused (see benchmarks/RESULTS.md).
    return FileSystemWriter(path, thread_count=WRITER_THREADS)


def _strict_false() -> StateDictOptions:
    # Pipeline stages hold only some of the keys the merged dict has.
    return StateDictOptions(strict=False, flatten_optimizer_state_dict=True)
