"""CPU guards for the trainer's per-step overhead, which CI cannot time on a GPU.

On an H100 the default single-process bf16 path once ran a 10M-parameter model
2.5x slower than a hand-written loop (issue 29): it wrapped the model in FSDP2
at shard degree 1, whose hooks, copies and DTensor dispatch are host work that
a small model cannot hide. These tests measure that host work where it is
deterministic, on the real default path (``build_runtime`` in a one-rank
process group, as ``torchfleet-train`` runs, with ``precision: bf16``):

- what the model is: a plain module, no ``FSDPModule``, no DTensor parameter,
  and after training steps no hook on any module or parameter (a hook costs
  host work each step however cheap it is, and a per-parameter one is too
  small for a call count to tell apart);
- Python calls per steady-state step (cProfile's count, which does not depend
  on the machine's speed or load) against a hand-written loop over the same
  model, within a budget near what the trainer needs.

Host syncs are test_host_sync.py's.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from tests.trainer.user_models import TINY_LLAMA
from torchfleet_contract.trainer_config import TrainConfig, load_config
from torchfleet_trainer.data import BatchSampler, load_corpus
from torchfleet_trainer.distributed import parallelize
from torchfleet_trainer.models import build_model
from torchfleet_trainer.schedule import lr_at
from torchfleet_trainer.train import StepOutcome, Trainer, build_runtime, make_optimizers

pytestmark = pytest.mark.trainer

BF16 = [
    *TINY_LLAMA,
    "training.precision=bf16",
    "optimizer.gradClip=1.0",
    "checkpoint.enabled=false",
    "metrics.enabled=false",
    "metrics.jsonLogs=false",
    "tensorboard.enabled=false",
]
WARMUP_STEPS = 3
PROFILED_STEPS = 10
# The trainer's step does a little more than the loop below (a dropout seed per
# step, a gradient norm over any mesh, a finite check that skips a bad update
# without a sync): 1.059x its calls (1,510 against 1,426 per step, the same
# count idle and beside two busy loops; cProfile counts calls, not time).
# What the budget must catch (issue 43, measured here): a getattr over the
# parameters each step 1.38x, forward hooks on every module 1.18x (1.24x on the
# review's machine), FSDP2 at shard degree 1 10x. A no-op grad hook per
# parameter (1.07x) is the hook test's.
CALL_BUDGET = 1.15


def bf16_trainer(*extra: str) -> Trainer:
    config = load_config(overrides=[*BF16, *extra], env={})
    runtime = build_runtime(config)
    assert runtime.dims is not None and runtime.world_size == 1, "not the launcher's path"
    return Trainer(config, runtime)


def test_default_single_process_bf16_is_a_plain_module(one_rank: None) -> None:
    model = bf16_trainer().model
    modules = [m for part in model.parts for m in part.modules()]
    assert not [type(m).__name__ for m in modules if isinstance(m, FSDPModule)]
    parameters = [(n, p) for part in model.parts for n, p in part.named_parameters()]
    assert not [n for n, p in parameters if isinstance(p, DTensor)]
    assert model.autocast_dtype == torch.bfloat16


def hooks(model: torch.nn.Module) -> list[str]:
    """Every hook on the model's modules and parameters, and torch's global ones."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    found = [
        f"{name or 'model'}.{kind}"
        for name, module in model.named_modules()
        for kind in kinds
        if getattr(module, kind)
    ]
    for name, parameter in model.named_parameters():
        for kind in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            if getattr(parameter, kind, None):
                found.append(f"{name}.{kind}")
    for kind in kinds:
        if getattr(torch.nn.modules.module, f"_global{kind}"):
            found.append(f"torch.nn.modules.module._global{kind}")
    return found


def test_training_steps_leave_no_hook_on_modules_or_parameters(one_rank: None) -> None:
    trainer = bf16_trainer("training.evalInterval=0", "training.logInterval=1000")
    trainer.model.train()
    trainer_steps(trainer)(WARMUP_STEPS)
    trainer.train_batches.close()
    found = [hook for part in trainer.model.parts for hook in hooks(part)]
    assert not found, f"{len(found)} hooks, each host work every step: {found[:8]}"


def calls(run: Callable[[], Any]) -> int:
    """Function calls (Python and builtin) cProfile counts while ``run`` runs."""
    profiler = cProfile.Profile()
    profiler.runcall(run)
    return pstats.Stats(profiler).total_calls  # type: ignore[attr-defined,no-any-return]


def hand_written_loop(config: TrainConfig) -> Callable[[int], None]:
    """``steps`` steps of the loop a careful user writes (nanoGPT's): schedule, batch,
    autocast forward and loss, backward, clipping, fused AdamW, no host sync."""
    torch.manual_seed(config.training.seed)
    corpus = load_corpus(config.data, config.model.vocab_size, config.training.seed)
    sampler = BatchSampler(corpus, config.data.seq_len, config.training.seed)
    model = build_model(config.model, corpus.vocab_size)
    model.init_weights()  # type: ignore[operator]
    optimizer = make_optimizers([model], config)[0]
    rows = config.training.global_batch_size
    state = {"step": 0}

    def run(steps: int) -> None:
        for _ in range(steps):
            state["step"] += 1
            for group in optimizer.param_groups:
                group["lr"] = lr_at(state["step"], config)
            inputs, targets = sampler.next_batch("train", rows)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def trainer_steps(trainer: Trainer) -> Callable[[int], None]:
    """The body of the trainer's loop for ``steps`` steps that do not settle."""
    state = {"step": 0}
    pending: list[StepOutcome] = []

    def run(steps: int) -> None:
        for _ in range(steps):
            state["step"] += 1
            pending.append(trainer._step(state["step"]))
            assert not trainer._settles_at(state["step"])

    return run


def test_python_calls_per_step_stay_near_a_hand_written_loop(one_rank: None) -> None:
    trainer = bf16_trainer("training.evalInterval=0", "training.logInterval=1000")
    trainer.model.train()
    ours = trainer_steps(trainer)
    reference = hand_written_loop(trainer.config)
    for run in (ours, reference):
        run(WARMUP_STEPS)
    per_step = {
        "torchfleet": calls(lambda: ours(PROFILED_STEPS)) / PROFILED_STEPS,
        "hand_written": calls(lambda: reference(PROFILED_STEPS)) / PROFILED_STEPS,
    }
    trainer.train_batches.close()
    ratio = per_step["torchfleet"] / per_step["hand_written"]
    assert ratio <= CALL_BUDGET, (
        f"{ratio:.3f}x a hand-written loop's Python calls per step (budget {CALL_BUDGET}x, "
        f"the trainer needs 1.06x): {per_step}"
    )


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_compile_traces_forward_and_loss_as_one_graph_without_recompiles(
    one_rank: None, monkeypatch: pytest.MonkeyPatch, checkpointing: str
) -> None:
    """Whole-model compile on one process: one graph for training's forward and
    loss, one for evaluation's (eval mode, no grad), no graph break, and nothing
    recompiles after the first step and evaluation. Traced with aot_eager (forward
    and backward through AOTAutograd, no inductor build)."""
    graphs: list[torch.fx.GraphModule] = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def counting(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(graph)
        return aot_eager(graph, inputs)

    monkeypatch.setattr(parallelize, "COMPILE_BACKEND", counting)
    torch._dynamo.reset()
    counters.clear()
    trainer = bf16_trainer(
        "training.compile=true",
        f"training.activationCheckpointing={checkpointing}",
        "training.gradAccumSteps=2",
        "training.steps=6",
        "training.logInterval=3",
        "training.evalInterval=3",
        "training.evalBatches=2",
    )
    evaluate = trainer.evaluate

    def then_no_recompiles(step: int) -> float:
        loss = evaluate(step)
        # Warmed up: the training and the evaluation graph exist.
        torch.compiler.set_stance("fail_on_recompile")
        return loss

    monkeypatch.setattr(trainer, "evaluate", then_no_recompiles)
    try:
        result = trainer.run()
    finally:
        torch.compiler.set_stance("default")

    assert result.last_step == 6 and sorted(result.eval_losses) == [3, 6]
    assert not dict(counters["graph_break"]), dict(counters["graph_break"])
    assert len(graphs) == 2, [g.graph for g in graphs]
    # Each graph holds the whole model and the loss (the output layer's matmul too).
    for graph in graphs:
        targets = {str(node.target) for node in graph.graph.nodes}
        assert any("cross_entropy" in t for t in targets), targets
