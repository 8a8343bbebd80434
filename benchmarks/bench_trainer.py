"""Trainer benchmarks: time-to-loss on Shakespeare, tokens/s + MFU against plain loops, checkpoints.

(a) nanoGPT's shakespeare-char recipe (6 layers, 6 heads, 384 wide, context
    256, batch 64, lr 1e-3, dropout 0.2, 5,000 iterations) through
    torchfleet's Trainer: best validation loss (target <= 1.47) and wall time.
    With --nanogpt, nanoGPT's own train.py runs the recipe too, and both sides
    do the same work besides training (``SAME_WORK``): nanoGPT's evaluations
    (iteration 0 and every 250, each estimating the train and the val loss
    over 200 batches of 64) and checkpoints on tmpfs on both sides.
(b) A Llama-style model of about 1B parameters on synthetic tokens: tokens/s
    and MFU of four variants at the largest batch all of them fit:
    ``torchfleet`` (the Trainer at world size 1), ``torchfleet_fsdp2`` (the
    same with FSDP2 forced at shard degree 1), ``plain_compiled`` (a
    hand-written loop over the same model, data and optimizer with
    ``torch.compile``) and ``plain_eager`` (the same loop without compile, for
    reference). The headline ratio is against ``plain_compiled``, so it
    measures what torchfleet adds, not what compile adds.
(c) Checkpoints: DCP save/load bytes per second against the disk's own
    write speed (the same bytes written and fsynced as one file), how long the
    loop is blocked by an asynchronous save compared with a blocking one, and
    load from a cold page cache: another process wrote the checkpoint, whose
    pages are evicted (fsync + posix_fadvise(DONTNEED), or with --drop-caches
    the kernel's whole page cache where that is allowed) and measured with
    mincore before the load.

Every measurement runs in a process of its own (``--child``), so one
variant's compiled graphs, allocator state or out-of-memory never colours the
next; an out-of-memory child moves the search to the next smaller batch.
All variants are timed alike: an optimizer step hook synchronises the device
at window boundaries only (after warm-up steps), so no variant syncs per step.

GPU recipe (one H100):  python benchmarks/bench_trainer.py --device cuda
CPU smoke run:          python benchmarks/bench_trainer.py --device cpu --quick
On CPU compile is off unless --compile-on-cpu (inductor's C++ build of even
the tiny model takes minutes on a small machine), so the quick run compares
eager loops and skips ``plain_compiled``.
Figures are printed and written to benchmarks/results/trainer-<device>.json.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import mmap
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torchfleet_contract.trainer_config import TrainConfig
from torchfleet_trainer.data import BatchSampler, load_corpus
from torchfleet_trainer.metrics import mfu_peak_tflops, no_peak_message
from torchfleet_trainer.models import build_model
from torchfleet_trainer.train import Trainer, build_runtime, init_distributed

# Wall-clock time (comparable across processes) when this module's imports were
# done: a child's start-up is measured from its parent's launch to here.
IMPORTED_AT = time.time()
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
VARIANTS = ("torchfleet", "torchfleet_fsdp2", "plain_compiled", "plain_eager")
# A child that ran out of device memory exits with this, so the parent tries a
# smaller batch; any other failure stops the benchmark.
EXIT_OOM = 3
RESULT_PREFIX = "BENCH_RESULT "


DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def shakespeare_config(
    device: str, quick: bool, compile_: bool, corpus: Path, checkpoints: Path
) -> TrainConfig:
    """nanoGPT's config/train_shakespeare_char.py, in TrainConfig terms, saving a
    checkpoint at every evaluation under ``checkpoints`` (nanoGPT saves at each
    one that improves the val loss)."""
    model: dict[str, Any] = {"layers": 6, "heads": 6, "dim": 384, "maxSeqLen": 256}
    training: dict[str, Any] = {"steps": 5000, "globalBatchSize": 64, "evalInterval": 250}
    training |= {"evalBatches": 200, "logInterval": 250, "device": device}
    seq_len = 256
    if quick:
        model = {"layers": 2, "heads": 4, "dim": 64, "maxSeqLen": 64}
        training |= {"steps": 200, "globalBatchSize": 16, "evalInterval": 100, "evalBatches": 10}
        training |= {"logInterval": 100}
        seq_len = 64
    return TrainConfig.model_validate(
        {
            "model": {**model, "architecture": "gpt", "dropout": 0.0 if quick else 0.2},
            "data": {"kind": "char", "path": str(corpus), "seqLen": seq_len},
            "optimizer": {"lr": 1e-3, "beta2": 0.99, "weightDecay": 0.1, "gradClip": 1.0},
            "schedule": {"warmupSteps": 100, "minLrRatio": 0.1},
            "training": {**training, "compile": compile_},
            "checkpoint": {"dir": str(checkpoints), "interval": training["evalInterval"]},
            "metrics": {"enabled": False, "jsonLogs": False},
        }
    )


# What both sides of the nanoGPT comparison do besides training: the same
# evaluations and checkpointing, the second side's defaults made the first's.
SAME_WORK = (
    "same evaluation work: nanoGPT's estimate_loss at iteration 0 and every evalInterval, "
    "train and val loss over evalBatches batches each, on both sides (torchfleet: its "
    "val evaluation, plus the train split's loss and an evaluation before step 1, added "
    "by this benchmark); checkpoints on both, on tmpfs, blocking (torchfleet: DCP at every "
    "evaluation; nanoGPT: torch.save at each one that improves the val loss); inductor "
    "caches cold on both"
)


def llama_config(device: str, quick: bool, batch: int, steps: int, compile_: bool) -> TrainConfig:
    """~1.2B parameters, Llama 3.2 1B's shape with a 32k vocabulary."""
    model: dict[str, Any] = {"layers": 16, "heads": 32, "kvHeads": 8, "dim": 2048}
    model |= {"ffnHidden": 8192, "vocabSize": 32768, "maxSeqLen": 2048}
    seq_len = 2048
    if quick:
        model = {"layers": 2, "heads": 4, "kvHeads": 2, "dim": 64, "vocabSize": 256}
        model |= {"maxSeqLen": 64}
        seq_len = 64
    return TrainConfig.model_validate(
        {
            "model": {**model, "architecture": "llama"},
            "data": {"kind": "synthetic", "seqLen": seq_len, "syntheticTokens": 4_000_000},
            "schedule": {"warmupSteps": 1},
            "training": {
                "steps": steps,
                "globalBatchSize": batch,
                "evalInterval": 0,
                # Settles (reads losses to the host) only at the last step.
                "logInterval": steps,
                "device": device,
                "compile": compile_,
            },
            "checkpoint": {"enabled": False},
            "metrics": {"enabled": False, "jsonLogs": False},
        }
    )


# ---- (a) Shakespeare -----------------------------------------------------------------


class PhaseClock:
    """Host seconds spent in named phases of one run, by timing calls of the
    functions that make them up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, phase: str, first_only: bool = False) -> None:
        original = getattr(owner, name)
        calls = {"n": 0}

        def timed(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if first_only and calls["n"] > 1:
                return original(*args, **kwargs)
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                self.seconds[phase] = self.seconds.get(phase, 0.0) + spent

        setattr(owner, name, timed)


def run_shakespeare(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe through the Trainer, checkpoints on tmpfs (see shakespeare_run)."""
    quick, compile_ = args.quick, compile_enabled(args)
    if not args.corpus.is_file():
        sys.exit(f"corpus not found at {args.corpus} (--corpus)")
    checkpoints = Path(tempfile.mkdtemp(prefix="torchfleet-bench-ckpt-", dir=tmpfs()))
    try:
        return shakespeare_run(
            args, shakespeare_config(args.device, quick, compile_, args.corpus, checkpoints)
        )
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)


def tmpfs() -> Path | None:
    """Where both sides of the nanoGPT comparison keep their checkpoints."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else None


def estimating_train_loss_too(trainer: Trainer, losses: dict[int, float]) -> None:
    """Each evaluation also estimates the train split's loss, as nanoGPT's
    estimate_loss does: evalBatches batches, drawn once and kept on the device as
    the validation batches are, their losses summed there and read with one sync."""
    evaluate = trainer.evaluate
    chunks: list[tuple[torch.Tensor, torch.Tensor]] = []

    def both_splits(step: int) -> float:
        if not chunks:
            chunks.extend(trainer.eval_chunks("train", trainer.config.training.eval_batches))
        trainer.model.train(False)
        losses[step] = trainer.mean_loss(chunks)
        trainer.model.train(True)
        return evaluate(step)

    trainer.evaluate = both_splits


def shakespeare_run(args: argparse.Namespace, config: TrainConfig) -> dict[str, Any]:
    """The recipe with nanoGPT's evaluation work, and where its wall clock went:
    start-up (interpreter and imports, from the parent's launch), the process
    group, the corpus, model set-up, the first step (compilation on the host,
    when on), training, evaluation, checkpoints. Evaluations end with a sync and
    saves block, so their time is real; the first step's is its host time, which
    is the compilation's."""
    import torchfleet_trainer.train as train_module

    quick, compile_ = args.quick, config.training.compile
    clock = PhaseClock()
    clock.wrap(train_module, "load_corpus", "corpus")
    began = time.perf_counter()
    trainer = Trainer(config, build_runtime(config))
    setup = time.perf_counter() - began - clock.seconds["corpus"]
    train_losses: dict[int, float] = {}
    estimating_train_loss_too(trainer, train_losses)
    clock.wrap(trainer, "_step", "first_step", first_only=True)
    clock.wrap(trainer, "evaluate", "eval")
    clock.wrap(trainer, "save", "checkpoint")
    began = time.perf_counter()
    # nanoGPT evaluates at iteration 0 too.
    before = trainer.evaluate(0)
    result = trainer.run()
    run_seconds = time.perf_counter() - began
    first, evaluation = clock.seconds["first_step"], clock.seconds.get("eval", 0.0)
    saving = clock.seconds.get("checkpoint", 0.0)
    # Step time: each window between settling steps (every evaluation: logInterval is
    # evalInterval) is timed apart from the evaluation and save that end it; the
    # first window holds the compile.
    windows = [
        r["step_seconds"] for r in result.history if r["step"] > config.training.log_interval
    ]
    split = {
        "start_up": IMPORTED_AT - args.launched_at if args.launched_at else None,
        "process_group": args.process_group_seconds,
        "corpus": clock.seconds["corpus"],
        "model_setup": setup,
        "first_step_incl_compile": first,
        "train": run_seconds - first - evaluation - saving,
        "eval": evaluation,
        "checkpoint": saving,
    }
    val_losses = {0: before, **result.eval_losses}
    best = min(val_losses.values())
    return {
        "recipe": "nanoGPT shakespeare-char" + (" (quick: 2x64, ctx 64)" if quick else ""),
        "steps": config.training.steps,
        "compile": compile_,
        "best_val_loss": round(best, 4),
        "target_val_loss": 1.47,
        "run_seconds": round(run_seconds, 1),
        "per_step_ms": round(1000 * statistics.median(windows), 2) if windows else None,
        "evaluations": len(val_losses),
        "checkpoints_saved": config.training.steps // config.checkpoint.interval,
        "wall_split_seconds": {k: round(v, 2) for k, v in split.items() if v is not None},
        "val_losses": {k: round(v, 4) for k, v in val_losses.items()},
        "train_losses": {k: round(v, 4) for k, v in train_losses.items()},
    }


def shakespeare_with_wall_clock(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe in a child process, timed from launch to exit as a user waits."""
    began = time.time()
    figures = require(run_child(args, "shakespeare", "--launched-at", repr(began)))
    figures["process_wall_seconds"] = round(time.time() - began, 1)
    accounted = sum(figures["wall_split_seconds"].values())
    figures["wall_split_seconds"]["exit_and_rest"] = round(
        figures["process_wall_seconds"] - accounted, 2
    )
    return figures


# nanoGPT's config/train_shakespeare_char.py, shrunk as shakespeare_config(quick=True).
NANOGPT_QUICK = [
    "--n_layer=2",
    "--n_head=4",
    "--n_embd=64",
    "--block_size=64",
    "--batch_size=16",
    "--max_iters=200",
    "--lr_decay_iters=200",
    "--eval_interval=100",
    "--eval_iters=10",
    # As the full recipe's: logged iterations that evaluate are left out of the
    # step time, so some must not.
    "--log_interval=10",
    "--dropout=0.0",
]
NANOGPT_EVAL_INTERVAL = {False: 250, True: 100}  # its config's, and NANOGPT_QUICK's
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config")
NANOGPT_EVAL = re.compile(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)")
NANOGPT_ITER = re.compile(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms")
NANOGPT_SAVE = "saving checkpoint to"


def run_nanogpt(args: argparse.Namespace) -> dict[str, Any]:
    """nanoGPT's own ``train.py config/train_shakespeare_char.py`` from the checkout
    at --nanogpt, in a scratch directory that links its code (nothing is copied
    into this repository), on data its own prepare.py makes from the same corpus
    (prepare.py downloads only when input.txt is missing), out_dir on tmpfs."""
    checkout: Path = args.nanogpt
    prepare = checkout / "data" / "shakespeare_char" / "prepare.py"
    needed = [checkout / name for name in NANOGPT_FILES] + [prepare]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        sys.exit(f"--nanogpt: {checkout} is not a nanoGPT checkout (missing {', '.join(missing)})")
    work = Path(tempfile.mkdtemp(prefix="torchfleet-nanogpt-"))
    out_dir = Path(tempfile.mkdtemp(prefix="torchfleet-nanogpt-out-", dir=tmpfs() or work))
    # Cold, as the Trainer's on its fresh checkpoint volume.
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")}
    try:
        for name in NANOGPT_FILES:
            (work / name).symlink_to((checkout / name).resolve())
        data = work / "data" / "shakespeare_char"
        data.mkdir(parents=True)
        shutil.copy(prepare, data / "prepare.py")
        shutil.copy(args.corpus, data / "input.txt")
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
        command = [sys.executable, "train.py", "config/train_shakespeare_char.py"]
        command += [f"--out_dir={out_dir}", f"--device={args.device}"]
        command += ["--compile=False"] if not compile_enabled(args) else []
        command += NANOGPT_QUICK if args.quick else []
        began = time.time()
        done = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, check=False
        )
        wall = time.time() - began
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"nanoGPT exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    evals = [(int(m[1]), float(m[2])) for m in NANOGPT_EVAL.finditer(done.stdout)]
    # An iteration that evaluates (and saves) times that too: left out, as the
    # Trainer's windows leave them out.
    every = NANOGPT_EVAL_INTERVAL[args.quick]
    iters = [
        float(m[2])
        for m in NANOGPT_ITER.finditer(done.stdout)
        if int(m[1]) > 0 and int(m[1]) % every
    ]
    if not evals:
        sys.exit(f"nanoGPT printed no evaluation\n{done.stdout[-2000:]}")
    best_step, best = min(evals, key=lambda e: e[1])
    return {
        "command": " ".join(command[1:]),
        "process_wall_seconds": round(wall, 1),
        "best_val_loss": round(best, 4),
        "best_step": best_step,
        # nanoGPT times the iterations it logs (each ends in a loss.item()).
        "per_step_ms": round(statistics.median(iters), 2) if iters else None,
        "evaluations": len(evals),
        "checkpoints_saved": done.stdout.count(NANOGPT_SAVE),
    }


# ---- (b) throughput ------------------------------------------------------------------


class StepClock:
    """Times windows of optimizer steps, synchronising the device only at window
    boundaries: the first ``warmup`` steps (compilation, allocator growth) are not
    timed, then ``windows`` windows of ``window`` steps each are."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, plan: Plan) -> None:
        self.device = device
        self.plan = plan
        self.steps = 0
        self.marks: list[float] = []
        optimizer.register_step_post_hook(self._after_step)

    def _after_step(self, *_: Any) -> None:
        self.steps += 1
        past_warmup = self.steps - self.plan.warmup
        if past_warmup >= 0 and past_warmup % self.plan.window == 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.marks.append(time.perf_counter())

    def tokens_per_second(self, tokens_per_step: int) -> float:
        """The median window's rate."""
        if len(self.marks) != self.plan.windows + 1:
            raise RuntimeError(f"timed {len(self.marks) - 1} windows of {self.plan.windows}")
        seconds = [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return tokens_per_step * self.plan.window / statistics.median(seconds)


class Plan:
    """How many steps a throughput child runs and times."""

    def __init__(self, quick: bool) -> None:
        self.warmup, self.window, self.windows = (2, 2, 2) if quick else (10, 10, 3)

    @property
    def steps(self) -> int:
        return self.warmup + self.window * self.windows


def force_fsdp_at_world_size_one() -> None:
    """The Trainer wraps in FSDP2 at world size 1 only as the bf16 memory mode
    (parallel.fsdpMemorySaving); the torchfleet_fsdp2 variant forces the wrapping
    in every dtype, so that the mode's cost at world size 1 is measured on CPU too."""
    from torchfleet_trainer.distributed.parallel_dims import ParallelDims

    ParallelDims.uses_fsdp = property(lambda self: True)


def torchfleet_throughput(config: TrainConfig, plan: Plan, fsdp: bool) -> dict[str, Any]:
    """tokens/s and FLOPs per token of the Trainer on one device."""
    if fsdp:
        force_fsdp_at_world_size_one()
    trainer = Trainer(config, build_runtime(config))
    if fsdp:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(trainer.model.parts[0], FSDPModule):
            raise RuntimeError("torchfleet_fsdp2: the Trainer's model is not FSDP2-wrapped")
    clock = StepClock(trainer.optimizers[0], trainer.runtime.device, plan)
    trainer.run()
    tokens = config.training.global_batch_size * config.data.seq_len
    return {
        "tokens_per_second": clock.tokens_per_second(tokens),
        "flops_per_token": trainer.flops_per_token,
    }


def plain_loop_throughput(config: TrainConfig, plan: Plan, compile_: bool) -> dict[str, Any]:
    """The baseline: a hand-written loop over the same model, data, optimizer and
    precision, written as a careful user would: fused AdamW (as the Trainer's), bf16
    autocast on CUDA, gradient clipping, batches copied without blocking, and no
    host sync per step (the loss is read once, at the end), as the Trainer's loop
    has none between log steps. ``compile_`` compiles the whole model."""
    device = torch.device(config.training.device)
    torch.manual_seed(config.training.seed)
    corpus = load_corpus(config.data, config.model.vocab_size, 0)
    with device:
        model = build_model(config.model, corpus.vocab_size)
    model.init_weights()
    if compile_:
        model.compile()
    opt = config.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        fused=True,
    )
    clock = StepClock(optimizer, device, plan)
    sampler = BatchSampler(corpus, config.data.seq_len, seed=0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    loss = torch.zeros((), device=device)
    for _ in range(plan.steps):
        inputs, targets = (
            t.to(device, non_blocking=True)
            for t in sampler.next_batch("train", config.training.global_batch_size)
        )
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    tokens = config.training.global_batch_size * config.data.seq_len
    return {"tokens_per_second": clock.tokens_per_second(tokens)}


def throughput_child(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan(args.quick)
    compiled = compile_enabled(args)
    variant = args.variant
    config = llama_config(
        args.device, args.quick, args.batch, plan.steps, compiled and variant != "plain_eager"
    )
    if variant.startswith("torchfleet"):
        figures = torchfleet_throughput(config, plan, fsdp=variant == "torchfleet_fsdp2")
    else:
        figures = plain_loop_throughput(config, plan, compile_=variant == "plain_compiled")
    if args.device == "cuda":
        figures["device_name"] = torch.cuda.get_device_name()
        figures["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    return figures


def batch_sizes(quick: bool) -> Iterator[int]:
    yield from ([8] if quick else [16, 12, 8, 6, 4, 2, 1])


def variants_to_run(args: argparse.Namespace) -> list[str]:
    """plain_compiled needs compile: on CPU only with --compile-on-cpu."""
    return [v for v in VARIANTS if v != "plain_compiled" or compile_enabled(args)]


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """The largest batch every variant fits, each (batch, variant) in its own process."""
    variants = variants_to_run(args)
    out_of_memory: dict[str, list[int]] = {}
    for batch in batch_sizes(args.quick):
        measured: dict[str, dict[str, Any]] = {}
        for variant in variants:
            result = run_child(args, "throughput", "--variant", variant, "--batch", str(batch))
            if result is None:
                out_of_memory.setdefault(variant, []).append(batch)
                break  # every variant must fit for a comparison at this batch
            measured[variant] = result
        if len(measured) == len(variants):
            return throughput_report(args, batch, measured, out_of_memory)
    raise SystemExit(f"no batch size fits every variant (out of memory: {out_of_memory})")


def throughput_report(
    args: argparse.Namespace,
    batch: int,
    measured: dict[str, dict[str, Any]],
    out_of_memory: dict[str, list[int]],
) -> dict[str, Any]:
    config = llama_config(args.device, args.quick, batch, 1, compile_=False)
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(config.model, 32768).parameters())
    rates = {v: m["tokens_per_second"] for v, m in measured.items()}
    ours = rates["torchfleet"]
    flops = measured["torchfleet"]["flops_per_token"]
    figures: dict[str, Any] = {
        "model": f"llama {params / 1e9:.3f}B params" if not args.quick else "llama tiny (quick)",
        "batch": batch,
        "seq_len": config.data.seq_len,
        "compile": compile_enabled(args),
        "tokens_per_second": {v: round(r, 1) for v, r in rates.items()},
        "flops_per_token": flops,
        "out_of_memory_at_batches": out_of_memory,
    }
    for baseline in ("plain_compiled", "plain_eager"):
        if baseline in rates:
            figures[f"speedup_vs_{baseline}"] = round(ours / rates[baseline], 3)
    figures["fsdp2_vs_torchfleet"] = round(rates["torchfleet_fsdp2"] / ours, 3)
    if "peak_memory_bytes" in measured["torchfleet"]:
        figures["peak_memory_bytes"] = {v: m["peak_memory_bytes"] for v, m in measured.items()}
    device_name = measured["torchfleet"].get("device_name")
    if device_name:
        figures["device_name"] = device_name
    peak = mfu_peak_tflops(args.peak_tflops, device_name, "bf16")
    if peak:
        figures["peak_tflops"] = peak
        figures["mfu"] = {v: round(r * flops / (peak * 1e12), 4) for v, r in rates.items()}
    elif device_name:
        figures["mfu_unavailable"] = no_peak_message(device_name)
    return figures


# ---- (c) checkpoints -----------------------------------------------------------------


def checkpoint_trainer(args: argparse.Namespace, directory: Path) -> Trainer:
    """A real Trainer's state after one step (so AdamW state exists)."""
    config = llama_config(args.device, args.quick, batch=1, steps=1, compile_=False)
    if args.quick:
        # Big enough (~40M parameters, ~0.5 GB with AdamW state) that bytes dominate.
        config.model = config.model.model_copy(
            update={"layers": 4, "dim": 512, "heads": 8, "kv_heads": 4, "vocab_size": 32768}
        )
    config.checkpoint.enabled = True
    config.checkpoint.dir = str(directory / "run")
    config.checkpoint.save_final = False
    trainer = Trainer(config, build_runtime(config))
    trainer.run()
    return trainer


def state_bytes(trainer: Trainer) -> int:
    assert trainer.checkpointer is not None
    state = trainer.checkpointer.state_dict({"step": 1})
    return sum(
        t.numel() * t.element_size()
        for section in ("model", "optimizer")
        for t in state.get(section, {}).values()
        if isinstance(t, torch.Tensor)
    )


def checkpointer_at(trainer: Trainer, root: Path, async_save: bool) -> Any:
    from torchfleet_trainer.checkpoint import Checkpointer

    config = trainer.config.checkpoint.model_copy(update={"async_save": async_save})
    return Checkpointer(root, config, trainer.model.parts, trainer.optimizers)


def checkpoint_save_child(args: argparse.Namespace) -> dict[str, Any]:
    """Saves (blocking and async); leaves the blocking one for the load child."""
    directory = args.scratch
    trainer = checkpoint_trainer(args, directory)
    nbytes = state_bytes(trainer)
    figures: dict[str, Any] = {"state_bytes": nbytes}
    sync = checkpointer_at(trainer, directory / "ckpt-sync", async_save=False)
    blocked = sync.save(10, {"step": 10})
    sync.wait()
    figures["sync_blocked_seconds"] = round(blocked, 4)
    figures["save_bytes_per_second"] = round(nbytes / blocked)
    asynchronous = checkpointer_at(trainer, directory / "ckpt-async", async_save=True)
    blocked = asynchronous.save(10, {"step": 10})
    began = time.perf_counter()
    asynchronous.wait()
    figures["async_blocked_seconds"] = round(blocked, 4)
    figures["async_total_seconds"] = round(blocked + time.perf_counter() - began, 4)
    shutil.rmtree(directory / "ckpt-async")
    figures["disk_write_bytes_per_second"] = round(disk_write_bytes_per_second(directory, nbytes))
    figures["save_vs_disk"] = round(
        figures["save_bytes_per_second"] / figures["disk_write_bytes_per_second"], 3
    )
    return figures


def checkpoint_load_child(args: argparse.Namespace) -> dict[str, Any]:
    """Loads what the save child wrote: first from the page cache as the parent left
    it (evicted), then again warm."""
    directory = args.scratch
    trainer = checkpoint_trainer(args, directory)
    nbytes = state_bytes(trainer)
    root = directory / "ckpt-sync"
    figures: dict[str, Any] = {"resident_before_cold_load": round(resident_fraction(root), 4)}
    for temperature in ("cold", "warm"):
        checkpointer = checkpointer_at(trainer, root, async_save=False)
        began = time.perf_counter()
        if checkpointer.load_latest({"step": 0}) is None:
            raise RuntimeError(f"no checkpoint to load under {root}")
        figures[f"{temperature}_load_bytes_per_second"] = round(
            nbytes / (time.perf_counter() - began)
        )
    return figures


def disk_write_bytes_per_second(directory: Path, size: int) -> float:
    """The disk's own speed for one large, fsynced sequential write."""
    payload = os.urandom(min(size, 64 << 20))
    path = directory / "disk-speed.bin"
    began = time.perf_counter()
    with path.open("wb") as handle:
        written = 0
        while written < size:
            handle.write(payload)
            written += len(payload)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - began
    path.unlink()
    return written / seconds


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.stat().st_size > 0]


def evict_page_cache(root: Path, drop_all: bool) -> str:
    """Takes the checkpoint's pages out of the page cache: the whole cache with
    drop_all where the kernel lets us, else each file's own (DONTNEED drops clean
    pages only, hence the fsync first). Returns the method that was used."""
    for path in files_under(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if drop_all:
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            return "drop_caches"
        except OSError:
            pass
    return "posix_fadvise"


def resident_fraction(root: Path) -> float:
    """The share of the files' pages in the page cache, by mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in files_under(root):
        size = path.stat().st_size
        pages = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            vector = ctypes.create_string_buffer(pages)
            try:
                if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
            finally:
                libc.munmap(ctypes.c_void_p(address), size)
        finally:
            os.close(fd)
        resident += sum(byte & 1 for byte in vector.raw)
        total += pages
    return resident / total if total else 0.0


def run_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    args.scratch.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=args.scratch))
    try:
        figures = require(run_child(args, "checkpoint-save", "--scratch", str(scratch)))
        figures["cold_cache_method"] = evict_page_cache(scratch / "ckpt-sync", args.drop_caches)
        figures |= require(run_child(args, "checkpoint-load", "--scratch", str(scratch)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return figures


# ---- processes -----------------------------------------------------------------------


def compile_enabled(args: argparse.Namespace) -> bool:
    return args.device == "cuda" or args.compile_on_cpu


def common_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--device", args.device, "--corpus", str(args.corpus)]
    flags += ["--quick"] if args.quick else []
    flags += ["--compile-on-cpu"] if args.compile_on_cpu else []
    return flags


def run_child(args: argparse.Namespace, child: str, *extra: str) -> dict[str, Any] | None:
    """Runs one measurement in a fresh process; None when it ran out of memory."""
    command = [sys.executable, __file__, "--child", child, *common_flags(args), *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == EXIT_OOM:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        sys.exit(
            f"{' '.join(command[2:])}: exit {done.returncode}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    return result


def require(result: dict[str, Any] | None) -> dict[str, Any]:
    if result is None:
        sys.exit("out of device memory")
    return result


CHILDREN = {
    "shakespeare": run_shakespeare,
    "throughput": throughput_child,
    "checkpoint-save": checkpoint_save_child,
    "checkpoint-load": checkpoint_load_child,
}


def child_main(args: argparse.Namespace) -> None:
    """One measurement: its own process group of one, its result on stdout."""
    began = time.perf_counter()
    init_distributed(llama_config(args.device, True, 1, 1, compile_=False))
    args.process_group_seconds = time.perf_counter() - began
    try:
        result = CHILDREN[args.child](args)
    except Exception as err:
        # Inside a compiled graph an OOM can arrive wrapped in another error.
        if isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower():
            sys.exit(EXIT_OOM)
        raise
    finally:
        dist.destroy_process_group()
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def side_by_side(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the comparison stands on, each side's next to the other's."""
    sides = {
        "torchfleet": report["shakespeare_char"],
        "nanogpt": report["nanogpt_shakespeare_char"],
    }
    figures = ["process_wall_seconds", "per_step_ms", "best_val_loss"]
    figures += ["evaluations", "checkpoints_saved"]
    return {"work": SAME_WORK} | {
        figure: {side: values.get(figure) for side, values in sides.items()} for figure in figures
    }


def target_line(what: str, value: float | None, limit: float, at_most: bool, quick: bool) -> str:
    if value is None:
        return f"{what}: not measured"
    met = value <= limit if at_most else value >= limit
    verdict = "met" if met else "MISSED"
    if quick:
        verdict += " (quick sizes: not the target's)"
    sign = "<=" if at_most else ">="
    return f"{what}: {value:.4g} (target {sign} {limit:g}) {verdict}"


def targets(report: dict[str, Any]) -> list[str]:
    """Issue 29's targets against this run's own baselines (one H100 for the real ones)."""
    quick, lines = report["quick"], []
    ours = report.get("shakespeare_char")
    if ours:
        lines.append(
            target_line("shakespeare best val loss", ours["best_val_loss"], 1.47, True, quick)
        )
        theirs = report.get("nanogpt_shakespeare_char")
        if theirs:
            ratio = ours["process_wall_seconds"] / theirs["process_wall_seconds"]
            lines.append(
                target_line("shakespeare process wall clock / nanoGPT's", ratio, 0.67, True, quick)
            )
    llama = report.get("llama_throughput")
    if llama:
        speedup = llama.get("speedup_vs_plain_compiled")
        lines.append(
            target_line("llama tokens/s / plain compiled loop's", speedup, 1.0, False, quick)
        )
        mfu = llama.get("mfu", {}).get("torchfleet")
        if mfu is None and "mfu_unavailable" in llama:
            lines.append(f"llama MFU: {llama['mfu_unavailable']}")
        else:
            lines.append(target_line("llama MFU", mfu, 0.52, False, quick))
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="Tiny configs (CPU smoke run).")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="Default: the GPU's own bf16 peak."
    )
    parser.add_argument("--only", choices=["shakespeare", "throughput", "checkpoint"], default=None)
    parser.add_argument(
        "--scratch", type=Path, default=Path("/tmp/torchfleet-bench"), help="For checkpoints."
    )
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="tinyshakespeare.txt for (a)."
    )
    parser.add_argument(
        "--compile-on-cpu", action="store_true", help="Compile on CPU too (slow to build)."
    )
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help="Drop the whole page cache before the cold load where allowed (root); "
        "otherwise only the checkpoint's files are evicted.",
    )
    parser.add_argument(
        "--nanogpt",
        type=Path,
        default=None,
        help="A nanoGPT checkout: also run its train.py config/train_shakespeare_char.py on "
        "the same corpus and device, and compare wall clocks (never copied in).",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device; use --device cpu --quick")
    if args.child:
        child_main(args)
        return
    began = time.perf_counter()
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        # The parent never touches the GPU (its context would cost the children memory).
        "device": "cuda" if args.device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "quick": args.quick,
        "compile": compile_enabled(args),
    }
    if args.only in (None, "shakespeare"):
        report["shakespeare_char"] = shakespeare_with_wall_clock(args)
        print(json.dumps(report["shakespeare_char"]), flush=True)
        if args.nanogpt:
            report["nanogpt_shakespeare_char"] = run_nanogpt(args)
            print(json.dumps(report["nanogpt_shakespeare_char"]), flush=True)
            report["nanogpt_comparison"] = side_by_side(report)
            print(json.dumps(report["nanogpt_comparison"]), flush=True)
    if args.only in (None, "throughput"):
        report["llama_throughput"] = run_throughput(args)
        print(json.dumps(report["llama_throughput"]), flush=True)
    if args.only in (None, "checkpoint"):
        report["checkpoint"] = run_checkpoint(args)
        print(json.dumps(report["checkpoint"]), flush=True)
    report["wall_seconds"] = round(time.perf_counter() - began, 1)
    report["targets"] = targets(report)
    for line in report["targets"]:
        print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"trainer-{args.device}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} ({report['wall_seconds']} s)")


if __name__ == "__main__":
    main()
