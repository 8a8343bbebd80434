"""Runs a list of training configs inside one torchrun process group.

Starting processes costs seconds (importing torch), so one launch runs many
layouts back to back, each with its own DeviceMesh over the same ranks.
A plan entry is ``{"name", "overrides", "single"?, "prepare"?}``: ``single``
runs the plain model on rank 0 alone (no parallelism at all, the reference);
``prepare`` lists filesystem steps rank 0 does first (copying a checkpoint
directory, dropping a completion marker) so resume cases start from a given
state on disk.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.tensor import DTensor

from torchfleet_contract.trainer_config import load_config
from torchfleet_trainer.train import Trainer, build_runtime


def prepare(steps: list[dict[str, str]]) -> None:
    for step in steps:
        if step["op"] == "copytree":
            shutil.copytree(step["src"], step["dst"], dirs_exist_ok=True)
        elif step["op"] == "unmark":
            # What a save killed before its marker leaves: shards, no COMPLETE.
            src = Path(step["src"])
            (src / "COMPLETE").unlink()
            if step.get("dst"):
                src.rename(step["dst"])


def count_ddp_syncs(trainer: Trainer) -> list[int]:
    """For a DDP model: how many forwards had run each time a gradient all-reduce
    started (a comm hook around DDP's default all-reduce). Filled in as it trains."""
    forwards: list[int] = []
    syncs: list[int] = []
    dims = trainer.runtime.dims
    ddp_parts = [part for part in trainer.model.parts if isinstance(part, DDP)]
    if dims is None or not ddp_parts:
        return syncs
    group = dims.mesh["dp_replicate"].get_group()

    def count_forward(module: nn.Module, args: Any) -> None:
        forwards.append(1)

    # Unannotated: DDP checks the bucket's annotation is GradBucket itself, and
    # this module's annotations are strings.
    def counting_allreduce(state, bucket):
        syncs.append(len(forwards))
        return allreduce_hook(state, bucket)

    for part in ddp_parts:
        part.register_forward_pre_hook(count_forward)
        part.register_comm_hook(group, counting_allreduce)
    return syncs


def watch_logits(trainer: Trainer) -> set[str]:
    """The layouts of the logits this rank's output layer produced: a DTensor's
    placements, or 'whole' for a plain tensor. Filled in as it trains."""
    seen: set[str] = set()

    def record(module: nn.Module, args: Any, output: Any) -> None:
        seen.add(str(output.placements) if isinstance(output, DTensor) else "whole")

    for part in trainer.model.parts:
        layer = getattr(part, "output", None)
        if isinstance(layer, nn.Module):
            layer.register_forward_hook(record)
    return seen


def run_entry(entry: dict[str, Any]) -> dict[str, Any] | None:
    began = time.perf_counter()
    config = load_config(overrides=entry["overrides"], env={})
    if dist.get_rank() == 0 and entry.get("prepare"):
        prepare(entry["prepare"])
    dist.barrier()
    trainer = None
    if not entry.get("single"):
        trainer = Trainer(config, build_runtime(config))
    elif dist.get_rank() == 0:
        trainer = Trainer(config, build_runtime(config, distributed=False))
    syncs = count_ddp_syncs(trainer) if trainer else []
    logits = watch_logits(trainer) if trainer else set()
    result = trainer.run() if trainer else None
    if entry.get("single"):
        dist.barrier()
    if trainer is None or result is None:
        return None
    return {
        "start_step": result.start_step,
        "losses": {int(r["step"]): r["loss"] for r in result.history},
        "grad_norms": {int(r["step"]): r["grad_norm"] for r in result.history},
        "eval": result.eval_losses,
        # How reduced precision was applied: FSDP's policy (else autocast).
        "fsdp_mixed_precision": trainer.model.fsdp_mixed_precision,
        "ddp_syncs_after_forwards": syncs,
        "logits_layouts": sorted(logits),
        "seconds": time.perf_counter() - began,
    }


def main() -> None:
    plan_path, out_path = sys.argv[1], sys.argv[2]
    plan = json.loads(Path(plan_path).read_text())
    dist.init_process_group("gloo")
    results: dict[str, Any] = {}
    try:
        for entry in plan:
            outcome = run_entry(entry)
            if dist.get_rank() == 0:
                results[entry["name"]] = outcome
    finally:
        dist.destroy_process_group()
    if results and all(v is not None for v in results.values()):
        Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
