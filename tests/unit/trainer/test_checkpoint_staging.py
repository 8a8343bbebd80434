"""Async checkpoints stage the state on the stager's own thread, and what they
write is the state at the save, whatever the optimizer does after the staging
wait. A one-rank gloo group in this process (the Checkpointer runs collectives)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from torchfleet_contract.trainer_config import CheckpointConfig
from torchfleet_trainer.checkpoint import Checkpointer, step_dir


class Gate:
    """Holds staging up: the stager deep-copies the state, this included."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __deepcopy__(self, memo: dict[int, Any]) -> int:
        assert self.open.wait(timeout=60), "gate never opened"
        return 0


def trained(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_async_save_stages_in_the_background_and_writes_the_state_at_the_save(
    one_rank: None, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    config = CheckpointConfig(async_save=True, keep_last=5)
    checkpointer = Checkpointer(tmp_path, config, [model], [opt])
    trained(model, opt)
    at_save = weights(model)
    gate = Gate()
    checkpointer.save(1, {"step": 1, "gate": gate})
    # save() returned while its host copy is still being taken.
    assert checkpointer.staging is not None and not checkpointer.staging.done()
    gate.open.set()
    checkpointer.wait_for_staging()
    trained(model, opt)  # changes the parameters the save copied
    after = weights(model)
    assert not torch.equal(after["weight"], at_save["weight"])
    checkpointer.save(2, {"step": 2})  # waits for save 1; reuses the stager's buffers
    checkpointer.wait()
    checkpointer.close()

    fresh = nn.Linear(8, 8)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    reader = Checkpointer(tmp_path, CheckpointConfig(keep_last=5), [fresh], [fresh_opt])
    for step, expected in ((1, at_save), (2, after)):
        state = reader.state_dict({"step": 0})
        dcp.load(state, checkpoint_id=str(step_dir(tmp_path, step)))
        assert state["train"]["step"] == step
        for name, tensor in expected.items():
            torch.testing.assert_close(state["model"][name], tensor, rtol=0, atol=0)
