"""Prometheus series on the pod's metrics port and one JSON line per logged step."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from torchfleet_contract import pod as contract

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900)


class TrainMetrics:
    """The trainer's series. Each process has its own registry; local rank 0 serves it."""

    def __init__(self) -> None:
        # Unlabelled: every series is exposed from the first scrape, and the
        # scraper adds job/pod labels from service discovery.
        self.registry = CollectorRegistry()

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=self.registry)

        self.step = gauge(contract.METRIC_STEP, "Last completed optimizer step.")
        self.total_steps = gauge(contract.METRIC_TOTAL_STEPS, "Steps this run trains for.")
        self.loss = gauge(contract.METRIC_LOSS, "Training loss of the last logged step.")
        self.eval_loss = gauge(contract.METRIC_EVAL_LOSS, "Validation loss, last evaluation.")
        self.learning_rate = gauge("torchfleet_train_learning_rate", "Current learning rate.")
        self.tokens_per_second = gauge(
            contract.METRIC_TOKENS_PER_SECOND, "Training tokens per second, all ranks."
        )
        self.mfu = gauge(contract.METRIC_MFU, "Model FLOPs utilisation against the peak (0-1).")
        self.gpu_memory = gauge(
            "torchfleet_train_gpu_memory_bytes", "Peak GPU memory allocated by this process."
        )
        self.step_seconds = Histogram(
            contract.METRIC_STEP_SECONDS,
            "Wall time of one optimizer step.",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.checkpoint_save_seconds = Histogram(
            contract.METRIC_CHECKPOINT_SAVE_SECONDS,
            "Time the loop was blocked saving a checkpoint.",
            buckets=CHECKPOINT_BUCKETS,
            registry=self.registry,
        )
        self.checkpoint_step = gauge(
            contract.METRIC_CHECKPOINT_STEP, "Step of the newest complete checkpoint."
        )
        self.checkpoint_load_seconds = gauge(
            "torchfleet_checkpoint_load_seconds", "Time taken to load the resumed checkpoint."
        )
        self.non_finite_steps = Counter(
            "torchfleet_train_non_finite_steps",
            "Steps whose loss or gradient norm was NaN or infinite (their update was skipped).",
            registry=self.registry,
        )
        node_labels = (contract.LABEL_NODE_RANK, contract.LABEL_NODE)

        def per_node(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, node_labels, registry=self.registry)

        self.node_compute_seconds = per_node(
            contract.METRIC_NODE_COMPUTE_SECONDS,
            "Mean seconds per step the node's slowest process spent computing (not waiting "
            "on its peers) over the last log interval. Rank 0 only.",
        )
        self.node_straggler_score = per_node(
            contract.METRIC_NODE_STRAGGLER_SCORE,
            "The node's compute seconds over the median node's (1 = typical). Rank 0 only.",
        )

        def one_hot(name: str, doc: str, label: str) -> Gauge:
            """One sample per value of ``label``: 1 for the current one, 0 for the others."""
            return Gauge(name, doc, (label,), registry=self.registry)

        self.phase = one_hot(
            contract.METRIC_PHASE,
            "1 for the phase the trainer is in, 0 for the others.",
            contract.LABEL_PHASE,
        )
        self.phase_started = gauge(
            contract.METRIC_PHASE_STARTED, "Unix time the current phase began."
        )
        self.set_phase(contract.PHASE_STARTING)
        self.in_place_restarts = gauge(
            contract.METRIC_IN_PLACE_RESTARTS,
            "In-place restarts of this gang generation's workers (the most any launcher counted).",
        )
        self.in_place_restart_reason = one_hot(
            contract.METRIC_IN_PLACE_RESTART_REASON,
            "1 for the reason of the last in-place restart, 0 for the others.",
            contract.LABEL_REASON,
        )
        self.preflight_matmul_flops = per_node(
            contract.METRIC_PREFLIGHT_MATMUL_FLOPS,
            "Preflight: matmul FLOP/s of the node's slowest process. Rank 0 only.",
        )
        self.preflight_matmul_ratio = per_node(
            contract.METRIC_PREFLIGHT_MATMUL_RATIO,
            "Preflight: the node's matmul FLOP/s over the median node's. Rank 0 only.",
        )
        self.preflight_node_passed = per_node(
            contract.METRIC_PREFLIGHT_NODE_PASSED,
            "Preflight: 1 if the node reached preflight.minMatmulFraction of the median, "
            "else 0. Rank 0 only.",
        )
        self.preflight_bus_bandwidth = gauge(
            contract.METRIC_PREFLIGHT_BUS_BANDWIDTH,
            "Preflight: all-reduce bus bandwidth of the gang (bytes x 2(n-1)/n per second).",
        )
        self.preflight_passed = gauge(
            contract.METRIC_PREFLIGHT_PASSED,
            "Preflight: 1 if every node and collective passed, else 0.",
        )
        self.preflight_seconds = gauge(
            contract.METRIC_PREFLIGHT_SECONDS, "Preflight: seconds the check took."
        )
        self.port: int | None = None

    def set_phase(self, phase: str) -> None:
        """Marks ``phase`` current (one of contract.PHASES) and when it began."""
        for each in contract.PHASES:
            self.phase.labels(each).set(1.0 if each == phase else 0.0)
        self.phase_started.set(time.time())

    def serve(self, port: int) -> int:
        """Starts /metrics; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, registry=self.registry)
        self.port = int(server.server_port)
        return self.port


def log_json(event: str, **fields: Any) -> None:
    """One machine-readable line on stdout, flushed so log shippers see it at once."""
    record = {"event": event, "time": round(time.time(), 3), **fields}
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def flops_per_token(num_params: int, layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token (PaLM appendix B): 6N plus attention's 12*L*d*T."""
    return 6.0 * num_params + 12.0 * layers * dim * seq_len


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak TFLOP/s of the devices whose name contains ``name``."""

    name: str
    bf16: float
    fp32: float


# From the vendors' datasheets, without sparsity: bf16 on tensor cores, fp32
# without TF32 (PyTorch's default for matmuls, which the trainer keeps). Matched
# in order against torch.cuda.get_device_name(), so variants come first; an SXM
# H100 reports itself as e.g. "NVIDIA H100 80GB HBM3".
DEVICE_PEAKS = (
    DevicePeak("H100 PCIe", bf16=756.0, fp32=51.0),
    DevicePeak("H100 NVL", bf16=835.0, fp32=60.0),
    DevicePeak("H100", bf16=989.0, fp32=67.0),
    DevicePeak("H200 NVL", bf16=835.0, fp32=60.0),
    DevicePeak("H200", bf16=989.0, fp32=67.0),
    DevicePeak("A100", bf16=312.0, fp32=19.5),
)


def device_peak_tflops(device_name: str, precision: Literal["bf16", "fp32"]) -> float | None:
    """The device's dense peak for ``precision``; None for a device not in the table
    (no MFU then, rather than a ratio against some other device's peak)."""
    wanted = device_name.lower()
    for peak in DEVICE_PEAKS:
        if peak.name.lower() in wanted:
            return peak.bf16 if precision == "bf16" else peak.fp32
    return None


def no_peak_message(device_name: str) -> str:
    """Why a run on ``device_name`` reports no MFU, and what to do about it."""
    known = ", ".join(peak.name for peak in DEVICE_PEAKS)
    return (
        f"no MFU: {device_name!r} is not in torchfleet_trainer.metrics.DEVICE_PEAKS "
        f"(known: {known}); set metrics.peakTflops (the benchmark's --peak-tflops) to its "
        "dense peak TFLOP/s"
    )


def mfu_peak_tflops(
    configured: float | None, device_name: str | None, precision: Literal["bf16", "fp32"]
) -> float | None:
    """metrics.peakTflops if set, else the accelerator's own (None on CPU)."""
    if configured is not None:
        return configured
    return device_peak_tflops(device_name, precision) if device_name else None
