"""Preflight: a seconds-long check of a new gang before its first step.

Each process measures its matmul throughput (bf16 on GPU, fp32 on CPU: what the
accelerator is bought for, whatever precision the job trains in); rank 0 gathers
them, reduces them to one figure per node (its slowest process) and reports any
node below ``preflight.minMatmulFraction`` of the median node. Then the gang
times all-reduces of one buffer on its own backend and reports the bus bandwidth
(nccl-tests' busbw, comparable across gang sizes). Every collective of the check
waits at most ``preflight.timeoutSeconds``: one that fails or times out fails
the gang with its own exit code, instead of the first training step hanging on
a dead link. A slow node is reported, not refused: the operator decides.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchfleet_contract.trainer_config import PreflightConfig
from torchfleet_trainer.health import GangNode, NodeFigure, per_node
from torchfleet_trainer.metrics import TrainMetrics
from torchfleet_trainer.runtime import Runtime

# Defaults by device: a 4096 bf16 matmul keeps an H100 busy ~0.2 ms per call;
# a 512 fp32 one takes a CPU core a few ms.
MATMUL_SIZE = {"cuda": 4096, "cpu": 512}
ALLREDUCE_MEBIBYTES = {"cuda": 256, "cpu": 16}
# Matmuls queued between host checks of the clock on a GPU (each check syncs).
GPU_MATMULS_PER_CHECK = 20


class PreflightFailed(RuntimeError):
    """A collective of the preflight check failed or timed out."""


@dataclass(frozen=True)
class PreflightReport:
    """What the check found: per node, the matmul FLOP/s of its slowest process."""

    nodes: list[NodeFigure]
    bus_bytes_per_second: float
    seconds: float
    min_fraction: float

    @property
    def slow(self) -> list[NodeFigure]:
        return [n for n in self.nodes if n.median_ratio < self.min_fraction]

    @property
    def passed(self) -> bool:
        return not self.slow


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device, size: int, seconds: float) -> float:
    """FLOP/s of repeated ``size`` square matmuls over about ``seconds``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)  # warm-up: kernels picked, memory touched
    synchronize(device)
    per_check = GPU_MATMULS_PER_CHECK if device.type == "cuda" else 1
    calls = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        for _ in range(per_check):
            torch.matmul(a, b, out=out)
        synchronize(device)
        calls += per_check
    return 2.0 * size**3 * calls / elapsed


def bounded(start: Callable[[], Any], what: str, timeout: float) -> None:
    """Runs an async collective and waits at most ``timeout`` seconds for it."""
    try:
        work = start()
        completed = work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as err:  # gloo and nccl report timeouts and lost peers this way
        raise PreflightFailed(f"{what} failed or timed out after {timeout:g}s: {err}") from None
    if completed is False:
        raise PreflightFailed(f"{what} did not complete within {timeout:g}s")


def gather_matmul(flops: float, runtime: Runtime, timeout: float) -> list[float]:
    local = torch.tensor([flops], dtype=torch.float64, device=runtime.device)
    gathered = [torch.empty_like(local) for _ in range(runtime.world_size)]
    bounded(lambda: dist.all_gather(gathered, local, async_op=True), "all-gather", timeout)
    return torch.cat(gathered).tolist()


def bus_bandwidth(config: PreflightConfig, runtime: Runtime) -> float:
    """All-reduce bus bandwidth (bytes/s): algorithm bandwidth x 2(n-1)/n."""
    device = runtime.device
    mebibytes = config.allreduce_mebibytes or ALLREDUCE_MEBIBYTES[device.type]
    buffer = torch.ones(mebibytes * 2**20 // 4, dtype=torch.float32, device=device)

    def all_reduce() -> None:
        bounded(
            lambda: dist.all_reduce(buffer, async_op=True), "all-reduce", config.timeout_seconds
        )

    all_reduce()  # warm-up, and every rank arrives at the timed ones together
    synchronize(device)
    began = time.perf_counter()
    for _ in range(config.allreduce_iterations):
        all_reduce()
    synchronize(device)
    per_call = (time.perf_counter() - began) / config.allreduce_iterations
    n = runtime.world_size
    return buffer.numel() * 4 / per_call * 2 * (n - 1) / n


def run_preflight(
    config: PreflightConfig, runtime: Runtime, gang: list[GangNode]
) -> PreflightReport:
    """The check, on every rank of the gang (collectives); the same report on each."""
    began = time.perf_counter()
    size = config.matmul_size or MATMUL_SIZE[runtime.device.type]
    flops = matmul_flops(runtime.device, size, config.matmul_seconds)
    per_rank = gather_matmul(flops, runtime, config.timeout_seconds)
    nodes = per_node(per_rank, gang, slowest_is_highest=False)
    bandwidth = bus_bandwidth(config, runtime)
    return PreflightReport(
        nodes, bandwidth, time.perf_counter() - began, config.min_matmul_fraction
    )


def publish(
    report: PreflightReport, metrics: TrainMetrics | None, log: Callable[..., None]
) -> None:
    """Rank 0: the figures as metrics, one JSON line, and one warning per slow node."""
    if metrics:
        for figure in report.nodes:
            labels = (str(figure.node.rank), figure.node.name)
            metrics.preflight_matmul_flops.labels(*labels).set(figure.value)
            metrics.preflight_matmul_ratio.labels(*labels).set(figure.median_ratio)
            passed = figure.median_ratio >= report.min_fraction
            metrics.preflight_node_passed.labels(*labels).set(1.0 if passed else 0.0)
        metrics.preflight_bus_bandwidth.set(report.bus_bytes_per_second)
        metrics.preflight_passed.set(1.0 if report.passed else 0.0)
        metrics.preflight_seconds.set(report.seconds)
    log(
        "preflight",
        passed=report.passed,
        seconds=round(report.seconds, 3),
        allreduce_bus_gbps=round(report.bus_bytes_per_second / 1e9, 3),
        nodes=[
            {
                "node_rank": n.node.rank,
                "node": n.node.name,
                "matmul_tflops": round(n.value / 1e12, 4),
                "median_ratio": round(n.median_ratio, 3),
            }
            for n in report.nodes
        ],
    )
    for n in report.slow:
        # Always on stderr, JSON logs or not: this is what a person looks for.
        print(
            f"torchfleet-train: preflight: node {n.node.name} (node rank {n.node.rank}) "
            f"reached {n.value / 1e12:.4g} TFLOP/s in matmuls, {n.median_ratio:.2f}x the "
            f"median node's, below preflight.minMatmulFraction={report.min_fraction:g}",
            file=sys.stderr,
            flush=True,
        )
        log(
            "preflight_slow_node",
            node_rank=n.node.rank,
            node=n.node.name,
            matmul_tflops=round(n.value / 1e12, 4),
            median_ratio=round(n.median_ratio, 3),
            min_fraction=report.min_fraction,
        )
