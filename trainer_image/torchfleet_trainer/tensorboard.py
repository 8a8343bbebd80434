"""TensorBoard event files of one run, written by rank 0.

Owns where the curves go (``tensorboard.dir``, else ``<checkpoint dir>/tensorboard``,
else nowhere), the tag names, and the purge that keeps a resumed run's curves free of
duplicated steps. It is fed values the loop has already brought to the host on its
log steps; it never touches a device tensor, so it adds no synchronisation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchfleet_contract.trainer_config import ResolvedDegrees, TrainConfig

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

SUBDIR = "tensorboard"

# Tag names: what a TensorBoard user (and the tests) look for.
LOSS = "train/loss"
LEARNING_RATE = "train/learning_rate"
GRAD_NORM = "train/grad_norm"
TOKENS_PER_SECOND = "train/tokens_per_second"
MFU = "train/mfu"
STEP_SECONDS = "train/step_seconds"
PEAK_GPU_MEMORY = "train/peak_gpu_memory_gib"
EVAL_LOSS = "eval/loss"
CHECKPOINT_SAVE_SECONDS = "checkpoint/save_seconds"
CONFIG_TEXT = "run/config"


def resolve_dir(config: TrainConfig, checkpoint_dir: str | None) -> Path | None:
    """tensorboard.dir, else a subdirectory of the checkpoint directory (so a resumed
    run appends to the same run); None when disabled or neither is set."""
    if not config.tensorboard.enabled:
        return None
    if config.tensorboard.dir:
        return Path(config.tensorboard.dir)
    return Path(checkpoint_dir) / SUBDIR if checkpoint_dir else None


def purge_step(start_step: int) -> int:
    """Steps from here on in earlier event files are dropped by TensorBoard's readers.

    A run resumed from the checkpoint of ``start_step`` trains ``start_step + 1``
    again, so what a crashed run logged after its last checkpoint would otherwise
    show twice. A fresh run (step 0) replaces whatever the directory held."""
    return start_step + 1 if start_step > 0 else 0


def config_summary(config: TrainConfig, degrees: ResolvedDegrees | None, world_size: int) -> str:
    """Markdown for the step-0 text panel: the parallel layout, then the config."""
    if degrees is None:
        layout = f"single process (world size {world_size})"
    else:
        layout = (
            f"world size {world_size} = pp {degrees.pp} x dp_replicate {degrees.dp_replicate}"
            f" x dp_shard {degrees.dp_shard} x tp {degrees.tp}"
        )
    body = json.dumps(config.model_dump(mode="json", by_alias=True), indent=2)
    # Four leading spaces: a Markdown code block, so the JSON keeps its layout.
    code = "\n".join(f"    {line}" for line in body.splitlines())
    return f"**Parallel layout:** {layout}\n\n**Config:**\n\n{code}"


class TensorBoardLog:
    """Rank 0's SummaryWriter; build it with :meth:`open` (None when not writing)."""

    def __init__(self, writer: SummaryWriter) -> None:
        self.writer = writer

    @classmethod
    def open(cls, directory: Path | None, start_step: int) -> TensorBoardLog | None:
        if directory is None:
            return None
        # Imported here: a process that writes no curves never loads TensorBoard.
        from torch.utils.tensorboard import SummaryWriter

        directory.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(str(directory), purge_step=purge_step(start_step), flush_secs=10)
        return cls(writer)

    def config(self, text: str) -> None:
        self.writer.add_text(CONFIG_TEXT, text, global_step=0)

    def step(self, step: int, record: dict[str, Any]) -> None:
        """One logged step; ``record`` holds host floats (see Trainer._report)."""
        scalars = {
            LOSS: record["loss"],
            LEARNING_RATE: record["lr"],
            GRAD_NORM: record["grad_norm"],
            TOKENS_PER_SECOND: record["tokens_per_second"],
            STEP_SECONDS: record["step_seconds"],
            MFU: record.get("mfu"),
            PEAK_GPU_MEMORY: record.get("peak_gpu_memory_gib"),
        }
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, value, global_step=step)

    def eval_loss(self, step: int, loss: float) -> None:
        self.writer.add_scalar(EVAL_LOSS, loss, global_step=step)

    def checkpoint_saved(self, step: int, seconds: float) -> None:
        self.writer.add_scalar(CHECKPOINT_SAVE_SECONDS, seconds, global_step=step)
        # A checkpoint is what a restart resumes from: its curves are on disk too.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
