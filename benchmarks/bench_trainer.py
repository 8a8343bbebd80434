"""Trainer benchmarks: time-to-loss on Shakespeare and tokens/s + MFU against a plain loop.

(a) nanoGPT's shakespeare-char recipe (6 layers, 6 heads, 384 wide, context
    256, batch 64, lr 1e-3, dropout 0.2, 5,000 iterations) through
    torchfleet's Trainer: best validation loss (target <= 1.47) and wall time.
(c) Checkpoints: DCP save/load bytes per second against the disk's own
    write speed (the same bytes written and fsynced as one file), and how long
    the loop is blocked by an asynchronous save compared with a blocking one.
(b) A Llama-style model of about 1B parameters on synthetic tokens at the
    largest batch that fits: tokens/s and MFU (against --peak-tflops, 989 =
    H100 SXM dense bf16), next to a plain eager single-GPU loop over the same
    model and data in the same run; the ratio is reported.

GPU recipe (one H100):  python benchmarks/bench_trainer.py --device cuda
CPU smoke run:          python benchmarks/bench_trainer.py --device cpu --quick
Figures are printed and written to benchmarks/results/trainer-<device>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torchfleet_trainer.config import TrainConfig
from torchfleet_trainer.data import BatchSampler, load_corpus
from torchfleet_trainer.models import build_model
from torchfleet_trainer.train import Trainer, build_runtime, init_distributed

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def shakespeare() -> Path:
    path = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
    if not path.is_file():
        sys.exit(f"corpus not found at {path}")
    return path


def shakespeare_config(device: str, quick: bool) -> TrainConfig:
    """nanoGPT's config/train_shakespeare_char.py, in TrainConfig terms."""
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
            "data": {"kind": "char", "path": str(shakespeare()), "seqLen": seq_len},
            "optimizer": {"lr": 1e-3, "beta2": 0.99, "weightDecay": 0.1, "gradClip": 1.0},
            "schedule": {"warmupSteps": 100, "minLrRatio": 0.1},
            "training": {**training, "compile": device == "cuda"},
            "checkpoint": {"enabled": False},
            "metrics": {"enabled": False, "jsonLogs": False},
        }
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
                "logInterval": 1000,
                "device": device,
                "compile": compile_,
            },
            "checkpoint": {"enabled": False},
            "metrics": {"enabled": False, "jsonLogs": False},
        }
    )


def run_shakespeare(device: str, quick: bool) -> dict[str, Any]:
    config = shakespeare_config(device, quick)
    trainer = Trainer(config, build_runtime(config))
    began = time.perf_counter()
    result = trainer.run()
    wall = time.perf_counter() - began
    best = min(result.eval_losses.values())
    return {
        "recipe": "nanoGPT shakespeare-char" + (" (quick: 2x64, ctx 64)" if quick else ""),
        "steps": config.training.steps,
        "best_val_loss": round(best, 4),
        "target_val_loss": 1.47,
        "wall_seconds": round(wall, 1),
        "eval_losses": {k: round(v, 4) for k, v in result.eval_losses.items()},
    }


def steady_tokens_per_second(step_seconds: list[float], tokens_per_step: int) -> float:
    """Median over the steps after warm-up (compilation, allocator growth)."""
    steady = sorted(step_seconds[len(step_seconds) // 3 :])
    return tokens_per_step / steady[len(steady) // 2]


def torchfleet_throughput(config: TrainConfig) -> tuple[float, float]:
    """(tokens/s, FLOPs per token) of the Trainer on one device."""
    trainer = Trainer(config, build_runtime(config))
    result = trainer.run()
    tokens = config.training.global_batch_size * config.data.seq_len
    seconds = [r["step_seconds"] for r in result.history]
    return steady_tokens_per_second(seconds, tokens), trainer.flops_per_token


def plain_loop_throughput(config: TrainConfig, device: torch.device) -> float:
    """The baseline: a hand-written eager loop, same model, data, optimizer, precision."""
    torch.manual_seed(0)
    corpus = load_corpus(config.data, config.model.vocab_size, 0)
    model = build_model(config.model, corpus.vocab_size).to(device)
    model.init_weights()  # type: ignore[operator]
    # PyTorch's default AdamW implementation, as the Trainer uses.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sampler = BatchSampler(corpus, config.data.seq_len, seed=0)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )
    seconds = []
    for _ in range(config.training.steps):
        began = time.perf_counter()
        inputs, targets = (
            t.to(device) for t in sampler.next_batch("train", config.training.global_batch_size)
        )
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.detach().item()  # synchronise, as the Trainer does when it reads the loss
        seconds.append(time.perf_counter() - began)
    del model, optimizer
    tokens = config.training.global_batch_size * config.data.seq_len
    return steady_tokens_per_second(seconds, tokens)


def disk_write_bytes_per_second(directory: Path, size: int) -> float:
    """The disk's own speed for one large, fsynced sequential write."""
    import os

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


def run_checkpoint(device: str, quick: bool, directory: Path) -> dict[str, Any]:
    """Save/load throughput of a real Trainer's state and the blocking time of async saves."""
    from torchfleet_trainer.checkpoint import Checkpointer

    config = llama_config(device, quick, batch=1, steps=1, compile_=False)
    if quick:
        # Big enough (~40M parameters, ~0.5 GB with AdamW state) that bytes dominate.
        config.model = config.model.model_copy(
            update={"layers": 4, "dim": 512, "heads": 8, "kv_heads": 4, "vocab_size": 32768}
        )
    config.checkpoint.enabled = True
    config.checkpoint.dir = str(directory / "ckpt")
    trainer = Trainer(config, build_runtime(config))
    trainer.run()  # one step, so AdamW state exists
    state = trainer.checkpointer.state_dict({"step": 1}) if trainer.checkpointer else {}
    nbytes = sum(
        t.numel() * t.element_size()
        for section in ("model", "optimizer")
        for t in state.get(section, {}).values()
        if isinstance(t, torch.Tensor)
    )
    figures: dict[str, Any] = {"state_bytes": nbytes}
    for mode in ("sync", "async"):
        config.checkpoint.async_save = mode == "async"
        root = directory / f"ckpt-{mode}"
        checkpointer = Checkpointer(
            root, config.checkpoint, trainer.model.parts, trainer.optimizers
        )
        blocked = checkpointer.save(10, {"step": 10})
        began = time.perf_counter()
        checkpointer.wait()
        figures[f"{mode}_blocked_seconds"] = round(blocked, 4)
        if mode == "sync":
            figures["save_bytes_per_second"] = round(nbytes / blocked)
            began = time.perf_counter()
            checkpointer.load_latest({"step": 0})
            figures["load_bytes_per_second"] = round(nbytes / (time.perf_counter() - began))
        else:
            figures["async_total_seconds"] = round(blocked + time.perf_counter() - began, 4)
        shutil.rmtree(root)
    figures["disk_write_bytes_per_second"] = round(disk_write_bytes_per_second(directory, nbytes))
    figures["save_vs_disk"] = round(
        figures["save_bytes_per_second"] / figures["disk_write_bytes_per_second"], 3
    )
    return figures


def batch_sizes(quick: bool) -> Iterator[int]:
    yield from ([8] if quick else [16, 12, 8, 6, 4, 2, 1])


def run_throughput(device: str, quick: bool, peak_tflops: float | None) -> dict[str, Any]:
    steps = 6 if quick else 30
    torch_device = torch.device(device)
    for batch in batch_sizes(quick):
        try:
            ours, flops = torchfleet_throughput(
                llama_config(device, quick, batch, steps, compile_=device == "cuda")
            )
            baseline = plain_loop_throughput(
                llama_config(device, quick, batch, steps, compile_=False), torch_device
            )
        except torch.OutOfMemoryError:
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        config = llama_config(device, quick, batch, steps, compile_=False)
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model(config.model, 32768).parameters())
        figures: dict[str, Any] = {
            "model": f"llama {params / 1e9:.3f}B params" if not quick else "llama tiny (quick)",
            "batch": batch,
            "seq_len": config.data.seq_len,
            "torchfleet_tokens_per_second": round(ours, 1),
            "plain_loop_tokens_per_second": round(baseline, 1),
            "speedup_vs_plain_loop": round(ours / baseline, 3),
            "flops_per_token": flops,
        }
        if peak_tflops:
            figures["peak_tflops"] = peak_tflops
            figures["torchfleet_mfu"] = round(ours * flops / (peak_tflops * 1e12), 4)
            figures["plain_loop_mfu"] = round(baseline * flops / (peak_tflops * 1e12), 4)
        return figures
    raise SystemExit("no batch size fits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="Tiny configs (CPU smoke run).")
    parser.add_argument("--peak-tflops", type=float, default=None, help="Default 989 on CUDA.")
    parser.add_argument("--only", choices=["shakespeare", "throughput", "checkpoint"], default=None)
    parser.add_argument(
        "--scratch", type=Path, default=Path("/tmp/torchfleet-bench"), help="For checkpoints."
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device; use --device cpu --quick")
    peak = args.peak_tflops or (989.0 if args.device == "cuda" else None)
    init_distributed(shakespeare_config(args.device, True))
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name()
        if args.device == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "quick": args.quick,
    }
    try:
        if args.only in (None, "shakespeare"):
            report["shakespeare_char"] = run_shakespeare(args.device, args.quick)
            print(json.dumps(report["shakespeare_char"]), flush=True)
        if args.only in (None, "throughput"):
            report["llama_throughput"] = run_throughput(args.device, args.quick, peak)
            print(json.dumps(report["llama_throughput"]), flush=True)
        if args.only in (None, "checkpoint"):
            args.scratch.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(dir=args.scratch))
            try:
                report["checkpoint"] = run_checkpoint(args.device, args.quick, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            print(json.dumps(report["checkpoint"]), flush=True)
    finally:
        dist.destroy_process_group()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"trainer-{args.device}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
