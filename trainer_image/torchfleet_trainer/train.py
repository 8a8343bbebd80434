"""The training loop and the per-process setup around it."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchfleet_contract import pod as contract
from torchfleet_contract.trainer_config import (
    ResolvedDegrees,
    TrainConfig,
    largest_world,
    pod_contract,
    recovery_settings,
    resolve_checkpoint_dir,
    resolve_metrics_port,
)
from torchfleet_trainer import tensorboard, termination
from torchfleet_trainer.checkpoint import Checkpointer
from torchfleet_trainer.data import (
    BatchSampler,
    DeviceBatches,
    Split,
    TrainBatchPrefetcher,
    inputs_and_targets,
    load_corpus,
)
from torchfleet_trainer.distributed.materialize import (
    initialise,
    materialise,
    needs_reference_buffers,
    reference_buffers,
)
from torchfleet_trainer.distributed.parallel_dims import ParallelDims
from torchfleet_trainer.distributed.parallelize import ParallelModel, parallelize
from torchfleet_trainer.health import (
    ComputeClock,
    GangNode,
    gather_floats,
    gather_gang_nodes,
    node_rank_of,
    per_node,
)
from torchfleet_trainer.metrics import TrainMetrics, flops_per_token, log_json, mfu_peak_tflops
from torchfleet_trainer.models import build_model
from torchfleet_trainer.preflight import publish, run_preflight
from torchfleet_trainer.runtime import Runtime
from torchfleet_trainer.schedule import lr_at
from torchfleet_trainer.tensorboard import TensorBoardLog
from torchfleet_trainer.timeouts import CollectiveTimeouts


@dataclass
class StepOutcome:
    """One step's results, left on the device until the loop settles them."""

    step: int
    lr: float
    loss: torch.Tensor
    grad_norm: torch.Tensor
    finite: torch.Tensor


@dataclass
class RunResult:
    status: str  # "completed", "preempted" (saved on SIGTERM) or "preempted_unsaved"
    start_step: int
    last_step: int
    history: list[dict[str, float]] = field(default_factory=list)
    eval_losses: dict[int, float] = field(default_factory=dict)


class StopFlag:
    """Set by SIGTERM; ranks agree on it at each step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.requested = True

        signal.signal(signal.SIGTERM, handler)

    def agreed(self, runtime: Runtime) -> bool:
        if runtime.dims is None or runtime.world_size == 1:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def pick_device(config: TrainConfig, local_rank: int) -> torch.device:
    wanted = config.training.device
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def pick_dtype(config: TrainConfig, device: torch.device) -> torch.dtype:
    precision = config.training.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return torch.bfloat16 if precision == "bf16" else torch.float32


def uses_meta_init(config: TrainConfig, device: torch.device) -> bool:
    """On GPUs build on the meta device and materialise only this rank's shards; on
    CPU build the whole model unless told otherwise, so every layout starts from
    bit-identical weights."""
    wanted = config.training.meta_device_init
    return wanted == "always" or (wanted == "auto" and device.type == "cuda")


def build_runtime(config: TrainConfig, distributed: bool = True) -> Runtime:
    """Reads this process's place from torch.distributed (already initialised)."""
    pod = pod_contract()
    local_rank = pod.local_rank
    device = pick_device(config, local_rank)
    dtype = pick_dtype(config, device)
    if not distributed:
        alone = ResolvedDegrees(dp_replicate=1, dp_shard=1, tp=1, pp=1)
        return Runtime(device, dtype, None, accum_steps=config.grad_accum_steps(alone))
    # An elastic job's micro batch is the one of its largest world, whatever the
    # world of this rendezvous round: accumulation absorbs the difference.
    largest = largest_world(pod, pod.process.local_world_size) if pod.process else None
    degrees = config.check_world(dist.get_world_size(), largest)
    dims = ParallelDims.build(degrees, device.type)
    return Runtime(
        device,
        dtype,
        dims,
        dist.get_rank(),
        dist.get_world_size(),
        local_rank,
        accum_steps=config.grad_accum_steps(degrees, largest),
    )


def make_optimizers(parts: list[nn.Module], config: TrainConfig) -> list[torch.optim.AdamW]:
    """One AdamW per model part; matrices decay, biases and norm gains do not."""
    opt = config.optimizer
    optimizers = []
    for part in parts:
        params = [p for p in part.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": opt.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # Fused (CPU and CUDA): one kernel per step, and found_inf lets a
        # non-finite step skip its update without a host sync.
        optimizers.append(
            torch.optim.AdamW(
                groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, fused=True
            )
        )
    return optimizers


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all gradients, whatever mesh each is sharded on.

    Parameters TP does not touch are sharded on the DP mesh alone, the rest on
    DP x TP; DTensor cannot combine those, so each mesh's norm is made whole
    separately. Groups keep parameter order, identical on every rank.
    """
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        by_mesh.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    squares = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.float() ** 2)
    return torch.stack(squares).sum().sqrt()


def clip_grad_norm(model: ParallelModel, max_norm: float, runtime: Runtime) -> torch.Tensor:
    """Global gradient norm over every shard and pipeline stage; clips when max_norm > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = total_norm([p.grad for p in params if p.grad is not None])
    if runtime.dims is not None and runtime.dims.degrees.pp > 1:
        # Each pipeline rank holds different parameters: sum the squares.
        squared = norm**2
        dist.all_reduce(squared, group=runtime.dims.mesh["pp"].get_group())
        norm = squared.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def mean_over_data_parallel(loss: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """The global batch's loss, on the device: only last pipeline stages hold one,
    TP ranks repeat it."""
    if runtime.dims is None or runtime.world_size == 1:
        return loss.detach().float()
    total = loss.detach().float().reshape(1).clone()
    dist.all_reduce(total)
    return total[0] / (runtime.dims.degrees.dp * runtime.dims.degrees.tp)


# Inductor's cache (compiled kernels, FX and AOTAutograd graphs), read when it
# first compiles; its writes are atomic renames, safe for ranks sharing a volume.
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def persist_compile_cache(config: TrainConfig, checkpoint_dir: str | None) -> Path | None:
    """With compile on, keeps inductor's cache on the checkpoint volume, so a
    restarted gang (or the next job on the same volume) loads its kernels instead of
    compiling them again. A cache directory the user set is left alone; without a
    checkpoint directory the cache stays in /tmp, lost with the pod."""
    if not (config.training.compile and config.checkpoint.enabled and checkpoint_dir):
        return None
    if COMPILE_CACHE_ENV not in os.environ:
        os.environ[COMPILE_CACHE_ENV] = str(Path(checkpoint_dir) / "compile-cache")
    return Path(os.environ[COMPILE_CACHE_ENV])


def now_stamp() -> str:
    """The termination report's timestamps: RFC 3339, UTC, whole seconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FinalFigures:
    """What rank 0 knows last of its run, for the termination report: the run
    can end within a scrape interval of its last steps and its last save, which
    the operator's final status must show (contract.REPORTED_*)."""

    step: int = 0
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    val_loss: float | None = None
    saved: tuple[int, str] | None = None  # the newest completed save: (step, time)

    def checkpoint_completed(self, step: int) -> None:
        self.saved = (step, now_stamp())

    def report(self, total_steps: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            contract.REPORTED_STEP: self.step,
            contract.REPORTED_TOTAL_STEPS: total_steps,
            contract.REPORTED_TIME: now_stamp(),
        }
        figures = {
            contract.REPORTED_LOSS: self.loss,
            contract.REPORTED_VAL_LOSS: self.val_loss,
            contract.REPORTED_TOKENS_PER_SECOND: self.tokens_per_second,
            contract.REPORTED_MFU: self.mfu,
        }
        # A non-finite figure is no JSON number: left out, as one never measured.
        fields |= {k: v for k, v in figures.items() if v is not None and math.isfinite(v)}
        if self.saved is not None:
            fields[contract.SAVED_CHECKPOINT_STEP] = self.saved[0]
            fields[contract.SAVED_CHECKPOINT_TIME] = self.saved[1]
        return fields


def seed_step(config: TrainConfig, step: int, runtime: Runtime) -> None:
    """Dropout randomness is a function of (seed, step, dp rank, pp rank): restored on
    resume by construction, and equal across TP ranks that hold replicated tensors.

    Seeds the CPU generator and this process's device's, as ``torch.manual_seed``
    would with the same seed, without its per-step walk over every backend (on a
    machine whose CUDA is not initialised it formats a stack trace per call)."""
    seed = hash((config.training.seed, step, runtime.dp_rank, runtime.pp_rank)) % (2**63)
    torch.default_generator.manual_seed(seed)
    if runtime.device.type == "cuda":
        torch.cuda.default_generators[runtime.device.index or 0].manual_seed(seed)


class Trainer:
    """Owns the model, optimizers, data, checkpoints and metrics of one run."""

    def __init__(
        self,
        config: TrainConfig,
        runtime: Runtime,
        metrics: TrainMetrics | None = None,
        metrics_port: int | None = None,
        gang: list[GangNode] | None = None,
        timeouts: CollectiveTimeouts | None = None,
    ) -> None:
        """``metrics`` are served on ``metrics_port`` (when given) once the run
        has resumed; ``timeouts`` (run_worker's) tightens the process groups'
        timeout after the first steps."""
        self.config = config
        self.runtime = runtime
        self.metrics = metrics
        self.metrics_port = metrics_port
        # Each process's node, by global rank (run_worker's, where preflight gathered it).
        self.gang = gang or gang_nodes(runtime)
        self.timeouts = timeouts
        self.clock = ComputeClock.for_device(runtime.device)
        training = config.training
        self.corpus = load_corpus(
            config.data, config.model.vocab_size, training.seed, training.eval_interval > 0
        )
        vocab = config.model.vocab_size or self.corpus.vocab_size
        self.model = self._build_model(vocab)
        self.optimizers = make_optimizers(self.model.parts, config)
        dims = runtime.dims
        self.dp_degree = dims.degrees.dp if dims else 1
        self.sampler = BatchSampler(
            self.corpus,
            config.data.seq_len,
            training.seed,
            dims.dp_rank if dims else 0,
            self.dp_degree,
        )
        self.train_batches: TrainBatchPrefetcher | DeviceBatches = (
            DeviceBatches(self.sampler, runtime.device)
            if DeviceBatches.fits(self.sampler, runtime.device)
            else TrainBatchPrefetcher(self.sampler, runtime.device)
        )
        # The validation batches every evaluation uses, drawn on the first.
        self.validation: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.final = FinalFigures()
        self.stop = StopFlag()
        self.peak_tflops = self._peak_tflops()
        self.non_finite = NonFiniteGuard(training.max_non_finite_steps, metrics, self.log)
        ckpt_dir = resolve_checkpoint_dir(config, pod_contract())
        self.compile_cache = persist_compile_cache(config, ckpt_dir)
        self.tensorboard_dir = tensorboard.resolve_dir(config, ckpt_dir)
        self.tensorboard: TensorBoardLog | None = None
        self.checkpointer = (
            Checkpointer(
                Path(ckpt_dir),
                config.checkpoint,
                self.model.parts,
                self.optimizers,
                on_complete=self._checkpoint_completed,
            )
            if config.checkpoint.enabled and ckpt_dir and runtime.dims is not None
            else None
        )
        if timeouts and self.checkpointer and self.checkpointer.async_group is not None:
            timeouts.exclude(self.checkpointer.async_group)

    def _peak_tflops(self) -> float | None:
        """For MFU: metrics.peakTflops, else the GPU's own peak at this precision."""
        device = self.runtime.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        precision: Literal["bf16", "fp32"] = (
            "bf16" if self.runtime.dtype == torch.bfloat16 else "fp32"
        )
        peak = mfu_peak_tflops(self.config.metrics.peak_tflops, name, precision)
        if peak is None and name is not None:
            self.log("mfu_unavailable", device=name, hint="set metrics.peakTflops")
        return peak

    def _build_model(self, vocab: int) -> ParallelModel:
        cfg, runtime = self.config, self.runtime
        torch.manual_seed(cfg.training.seed)
        meta = uses_meta_init(cfg, runtime.device)
        with torch.device("meta") if meta else runtime.device:
            model = build_model(cfg.model, vocab)
        reference: dict[str, torch.Tensor] = {}
        if meta and needs_reference_buffers(model):
            reference = reference_buffers(cfg.model, vocab)
        if not meta:
            # Re-seeded as the meta path is, so both give the same weights.
            torch.manual_seed(cfg.training.seed)
            _init_weights(model)
        self.flops_per_token = flops_per_token(
            sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n),
            cfg.model.layers,
            cfg.model.dim,
            cfg.data.seq_len,
        )
        parallel = parallelize(model, cfg, runtime.dims, runtime.device, runtime.dtype)
        if meta:
            pp_rank = runtime.dims.rank_in("pp") if runtime.dims else 0
            for part in parallel.parts:
                materialise(part, runtime.device)
                initialise(part, reference, cfg.training.seed, pp_rank)
        return parallel

    def train_state(self, step: int) -> dict[str, Any]:
        return {"step": step, **self.sampler.state_dict()}

    def resume(self) -> int:
        if self.checkpointer is None:
            return 0
        state = self.train_state(0)
        with self.phase(contract.PHASE_CHECKPOINT, then=contract.PHASE_STARTING):
            loaded = self.checkpointer.load_latest(state)
        if loaded is None:
            return 0
        step, seconds = loaded
        self.sampler.load_state_dict(state)
        if self.metrics:
            self.metrics.checkpoint_load_seconds.set(seconds)
            self.metrics.checkpoint_step.set(step)
            # The last completed step is the checkpoint's until this gang logs one.
            self.metrics.step.set(step)
        self.log("resumed", step=step, load_seconds=round(seconds, 4))
        return step

    def run(self) -> RunResult:
        cfg = self.config.training
        self.stop.install()
        if self.metrics:
            self.metrics.total_steps.set(cfg.steps)
        # An elastic job's world changes between restarts; the global batch does not.
        self.log(
            "world",
            world_size=self.runtime.world_size,
            data_parallel=self.dp_degree,
            grad_accum_steps=self.runtime.accum_steps,
        )
        start = self.resume()
        self.final.step = start
        self._serve_metrics()
        result = RunResult("completed", start, start)
        self.model.train()
        self._open_tensorboard(start)
        self.set_phase(contract.PHASE_TRAIN)
        try:
            self._loop(start, result)
        except TrainingDiverged:
            # Every rank stops at the same step; a save in flight holds good weights.
            if self.checkpointer:
                self.checkpointer.wait()
            self.leave_final_report()
            raise
        except BaseException:
            # A failed run's figures too: the operator shows them with the
            # failure, whose last log lines the launcher puts beside them.
            self.leave_final_report()
            raise
        finally:
            self.train_batches.close()
            if self.tensorboard:
                self.tensorboard.close()
        if self.checkpointer:
            with self.phase(contract.PHASE_CHECKPOINT, then=contract.PHASE_DONE):
                self.checkpointer.wait()
                self.checkpointer.close()
        if result.status == "completed":
            self.leave_final_report()  # a stopped run left its own (_loop)
        self.set_phase(contract.PHASE_DONE)
        return result

    def _checkpoint_completed(self, step: int) -> None:
        self.final.checkpoint_completed(step)
        if self.metrics:
            self.metrics.checkpoint_step.set(step)

    def leave_final_report(self) -> None:
        """Rank 0's final figures in its pod's termination message, where the
        operator reads them with the pod's end (contract.REPORTED_*), however
        the run ended."""
        if not self.runtime.is_logger:
            return
        path = termination.destination(pod_contract())
        if path is not None:
            termination.update(path, self.final.report(self.config.training.steps))

    def _serve_metrics(self) -> None:
        """/metrics from here on, not before the resume: until then the step gauge
        holds 0, and a scrape of it would take a resumed job's progress back to
        the start (the checkpoint's step is what it shows from its first scrape)."""
        if self.metrics is None or self.metrics_port is None:
            return
        port = self.metrics.serve(self.metrics_port)
        if self.runtime.is_logger and self.config.metrics.json_logs:
            log_json("metrics", port=port)

    def set_phase(self, phase: str) -> None:
        if self.metrics:
            self.metrics.set_phase(phase)

    @contextmanager
    def phase(self, phase: str, then: str = contract.PHASE_TRAIN) -> Iterator[None]:
        """In ``phase`` while the block runs, then in ``then``."""
        self.set_phase(phase)
        try:
            yield
        finally:
            self.set_phase(then)

    def _open_tensorboard(self, start: int) -> None:
        """Rank 0 only; after the resume, whose step decides what earlier files lose."""
        if not self.runtime.is_logger:
            return
        self.tensorboard = TensorBoardLog.open(self.tensorboard_dir, start)
        if self.tensorboard is None:
            return
        self.log("tensorboard", dir=str(self.tensorboard_dir))
        if start == 0:
            degrees = self.runtime.dims.degrees if self.runtime.dims else None
            summary = tensorboard.config_summary(self.config, degrees, self.runtime.world_size)
            self.tensorboard.config(summary)

    def _loop(self, start: int, result: RunResult) -> None:
        """Steps run without waiting on the device; their losses and gradient norms
        come to the host together at the next settling step (``_settles_at``),
        which is also where the ranks agree on a stop."""
        cfg = self.config.training
        pending: list[StepOutcome] = []
        began = time.perf_counter()
        settled = 0
        self.clock.steps_begin()
        for step in range(start + 1, cfg.steps + 1):
            pending.append(self._step(step))
            if not self._settles_at(step):
                continue
            self.clock.steps_end(len(pending))
            window = time.perf_counter() - began
            finite = self._settle(pending, window, result)
            settled += 1
            if settled == 2:
                # The first window holds compilation and warm-up; the second is steady.
                self._tighten_timeouts(window / len(pending))
            pending = []
            if self._logs_at(step):
                self._report_nodes()
            # Before evaluating: a preempted pod's grace period goes to the save.
            stopping = self.stop.agreed(self.runtime)
            if not stopping and self._evaluates_at(step):
                result.eval_losses[step] = self.final.val_loss = self.evaluate(step)
            if self.checkpointer:
                self.checkpointer.poll()
            saves = self._should_save(step, stopping, finite)
            if saves:
                self.save(step, final=stopping or step == cfg.steps)
            if stopping:
                result.status = "preempted" if saves else "preempted_unsaved"
                self.log("preempted", step=step, saved=saves)
                if saves:  # at once: the grace period may end before anything else runs
                    self.leave_final_report()
                break
            began = time.perf_counter()
            self.clock.steps_begin()

    def _step(self, step: int) -> StepOutcome:
        """One optimizer step, with no host sync: a non-finite loss or gradient norm
        skips the update on the device (fused AdamW's found_inf)."""
        cfg = self.config.training
        lr = lr_at(step, self.config)
        seed_step(self.config, step, self.runtime)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=self.runtime.device)
        accum = self.runtime.accum_steps
        # This rank's rows of the step's global batch, in accumulation chunks.
        batch_inputs, batch_targets = self._train_batch(cfg.global_batch_size)
        chunks = zip(batch_inputs.chunk(accum), batch_targets.chunk(accum), strict=True)
        self.clock.section_begins()
        for index, (inputs, targets) in enumerate(chunks):
            last = index == accum - 1
            micro = self.model.forward_backward(inputs, targets, 1 / accum, sync_grads=last)
            loss += micro / accum
        self.clock.section_ends()
        grad_norm = clip_grad_norm(self.model, self.config.optimizer.grad_clip, self.runtime)
        mean_loss = mean_over_data_parallel(loss, self.runtime)
        # Both values are reduced over every rank, so all ranks decide alike.
        finite = torch.isfinite(mean_loss) & torch.isfinite(grad_norm)
        skip = (~finite).float()
        if self.checkpointer:
            # An async save may still be copying the parameters this step updates.
            self.checkpointer.wait_for_staging()
        self.clock.section_begins()
        for opt in self.optimizers:
            opt.found_inf = skip  # type: ignore[attr-defined]
            opt.step()
        self.clock.section_ends()
        return StepOutcome(step, lr, mean_loss, grad_norm, finite)

    def _tighten_timeouts(self, step_seconds: float) -> None:
        if self.timeouts is None or self.runtime.world_size == 1:
            return
        seconds = self.timeouts.tighten(step_seconds)
        self.log("collective_timeout", seconds=round(seconds, 3))

    def _settles_at(self, step: int) -> bool:
        """Steps whose results the host needs: logged, evaluated, checkpointed or last;
        a lone process also stops at once (it has no peers to agree with)."""
        checkpoints = self.checkpointer is not None and step % self.config.checkpoint.interval == 0
        return (
            self._logs_at(step)
            or self._evaluates_at(step)
            or checkpoints
            or (self.runtime.world_size == 1 and self.stop.requested)
        )

    def _settle(self, pending: list[StepOutcome], seconds: float, result: RunResult) -> bool:
        """Brings the pending steps' values to the host in one transfer, reports and
        checks them; whether the last of them was finite."""
        values = torch.stack(
            [torch.stack([o.loss.float(), o.grad_norm.float(), o.finite.float()]) for o in pending]
        ).tolist()
        # Steps queue on the device: only their mean time is known without syncing each.
        per_step = seconds / len(pending)
        for outcome, (loss, grad_norm, finite) in zip(pending, values, strict=True):
            record = {"step": outcome.step, "loss": loss}
            record.update(lr=outcome.lr, grad_norm=grad_norm, step_seconds=per_step)
            result.history.append(record)
            result.last_step = outcome.step
            self._report(record)
            self.non_finite.observe(outcome.step, finite == 1.0, loss, grad_norm)
        return bool(values[-1][2] == 1.0)

    def _logs_at(self, step: int) -> bool:
        cfg = self.config.training
        return step % cfg.log_interval == 0 or step == cfg.steps

    def _report_nodes(self) -> None:
        """Every rank's compute seconds per step over the interval to rank 0, which
        exports them per node with the node's straggler score (one all-gather)."""
        seconds = self.clock.per_step() or 0.0
        values = gather_floats(seconds, self.runtime.world_size, self.runtime.device)
        if not (self.runtime.is_logger and self.metrics):
            return
        for figure in per_node(values, self.gang, slowest_is_highest=True):
            labels = (str(figure.node.rank), figure.node.name)
            self.metrics.node_compute_seconds.labels(*labels).set(figure.value)
            self.metrics.node_straggler_score.labels(*labels).set(figure.median_ratio)

    def _evaluates_at(self, step: int) -> bool:
        every, last = self.config.training.eval_interval, self.config.training.steps
        return every > 0 and (step % every == 0 or step == last)

    def _train_batch(self, global_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.train_batches.next(global_rows)
        device = self.runtime.device
        return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    def _should_save(self, step: int, stopping: bool, finite: bool) -> bool:
        if self.checkpointer is None:
            return False
        ckpt = self.config.checkpoint
        if stopping:
            return ckpt.save_on_sigterm
        if step == self.config.training.steps:
            return ckpt.save_final
        # A skipped step left the weights as they were: saving them again under a
        # new step would only push older good checkpoints out of keepLast.
        return finite and step % ckpt.interval == 0

    def save(self, step: int, final: bool) -> None:
        assert self.checkpointer is not None
        # The last save before exiting must finish, so it is never asynchronous.
        generous = self.timeouts.generous() if self.timeouts else nullcontext()
        with self.phase(contract.PHASE_CHECKPOINT), generous:
            seconds = self.checkpointer.save(step, self.train_state(step), force_sync=final)
        if self.metrics:
            self.metrics.checkpoint_save_seconds.observe(seconds)
        if self.tensorboard:
            self.tensorboard.checkpoint_saved(step, seconds)
        self.log("checkpoint", step=step, blocked_seconds=round(seconds, 4))

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Mean loss over the same evalBatches validation batches every time: kept on
        the device, their losses summed there and read with one sync."""
        self.model.train(False)
        # The first evaluation compiles its own graph, which ranks may finish far
        # apart: it runs under the generous collective timeout, as saves do.
        first = self.validation is None
        generous = self.timeouts.generous() if self.timeouts and first else nullcontext()
        with self.phase(contract.PHASE_EVAL), generous:
            loss = self.mean_loss(self._validation_chunks())
        self.model.train(True)
        if self.metrics:
            self.metrics.eval_loss.set(loss)
        if self.tensorboard:
            self.tensorboard.eval_loss(step, loss)
        self.log("eval", step=step, val_loss=round(loss, 6))
        return loss

    @torch.no_grad()
    def mean_loss(self, chunks: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Mean loss of the model as it is (evaluate() puts it in eval mode) over
        ``chunks``, over every data-parallel rank: summed on the device, read with
        one sync."""
        total = torch.zeros((), device=self.runtime.device)
        for inputs, targets in chunks:
            total += self.model.eval_loss(inputs, targets).float()
        return float(mean_over_data_parallel(total, self.runtime)) / len(chunks)

    def _validation_chunks(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first evalBatches global validation batches, drawn once."""
        if self.validation is None:
            self.validation = self.eval_chunks("val", self.config.training.eval_batches)
        return self.validation

    def eval_chunks(self, split: Split, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``batches`` global batches of ``split``, this rank's rows, on the
        device in training's micro-batch chunks: the largest batch memory is known
        to take. Copied without blocking (from pinned memory on a GPU), so drawing
        them is no host sync."""
        rows, accum = self.config.training.global_batch_size, self.runtime.accum_steps
        chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
        for index in range(batches):
            windows = self.sampler.windows_at(split, index, rows)
            if self.runtime.device.type == "cuda":
                windows = windows.pin_memory()
            windows = windows.to(self.runtime.device, non_blocking=True)
            chunks += [inputs_and_targets(w) for w in windows.chunk(accum)]
        return chunks

    def _report(self, record: dict[str, float]) -> None:
        step_seconds = record["step_seconds"]
        tokens = self.config.training.global_batch_size * self.config.data.seq_len
        tokens_per_second = tokens / step_seconds
        mfu = self._mfu(tokens_per_second)
        # The allocator's own counter: no device sync.
        on_cuda = self.runtime.device.type == "cuda"
        peak_memory = torch.cuda.max_memory_allocated(self.runtime.device) if on_cuda else None
        if self.metrics:
            m = self.metrics
            m.step.set(record["step"])
            m.loss.set(record["loss"])
            m.learning_rate.set(record["lr"])
            m.tokens_per_second.set(tokens_per_second)
            m.step_seconds.observe(step_seconds)
            if mfu is not None:
                m.mfu.set(mfu)
            if peak_memory is not None:
                m.gpu_memory.set(peak_memory)
        step = int(record["step"])
        self.final.step, self.final.loss = step, record["loss"]
        self.final.tokens_per_second, self.final.mfu = tokens_per_second, mfu
        if self._logs_at(step):
            # Significant digits: a small model's MFU is far below 1e-4.
            extra = {"mfu": significant(mfu, 4)} if mfu is not None else {}
            self.log("step", **record, tokens_per_second=round(tokens_per_second, 1), **extra)
            if self.tensorboard:
                curves = {**record, "tokens_per_second": tokens_per_second, "mfu": mfu}
                if peak_memory is not None:
                    curves["peak_gpu_memory_gib"] = peak_memory / 2**30
                self.tensorboard.step(step, curves)

    def _mfu(self, tokens_per_second: float) -> float | None:
        peak = self.peak_tflops
        if peak is None:
            return None
        achieved = tokens_per_second * self.flops_per_token
        return achieved / (peak * 1e12 * self.runtime.world_size)

    def log(self, event: str, **fields: Any) -> None:
        if self.runtime.is_logger and self.config.metrics.json_logs:
            clean = {k: _loggable(v) for k, v in fields.items()}
            log_json(event, **clean)


def significant(value: float, digits: int) -> float:
    """``value`` to ``digits`` significant digits (rounding to decimals would turn a
    small value into 0)."""
    return float(f"{value:.{digits}g}")


def _loggable(value: Any) -> Any:
    """Floats to 6 decimals, or 6 significant digits below 1 (a learning rate of
    3e-7 or an MFU of 2e-5 stays itself); NaN and infinities as strings, which
    strict JSON parsers accept."""
    if not isinstance(value, float):
        return value
    if not math.isfinite(value):
        return str(value)
    return round(value, 6) if abs(value) >= 1 else significant(value, 6)


class TrainingDiverged(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient norm."""


class NonFiniteGuard:
    """Counts steps skipped for a NaN/inf loss or gradient norm; fails the run after
    ``limit`` in a row (``training.maxNonFiniteSteps``)."""

    def __init__(self, limit: int, metrics: TrainMetrics | None, log: Callable[..., None]) -> None:
        self.limit = limit
        self.metrics = metrics
        self.log = log
        self.consecutive = 0
        self.total = 0

    def observe(self, step: int, finite: bool, loss: float, grad_norm: float) -> None:
        if finite:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total += 1
        if self.metrics:
            self.metrics.non_finite_steps.inc()
        self.log(
            "non_finite_step",
            step=step,
            loss=loss,
            grad_norm=grad_norm,
            consecutive=self.consecutive,
            total=self.total,
        )
        if self.consecutive >= self.limit:
            raise TrainingDiverged(
                f"training.maxNonFiniteSteps: {self.consecutive} consecutive steps (up to step "
                f"{step}) had a non-finite loss or gradient norm (loss={loss}, grad norm="
                f"{grad_norm}); their updates were skipped and the run stops"
            )


def _init_weights(model: nn.Module) -> None:
    """A direct build: built-in models initialise themselves; user models' constructors
    already did."""
    init = getattr(model, "init_weights", None)
    if callable(init):
        init()


# ---- process entry ---------------------------------------------------------------------


def init_distributed(config: TrainConfig) -> None:
    """Joins the process group torchrun (or the pod contract) describes, with the
    generous collective timeout (timeouts.py tightens it after the first steps)."""
    if dist.is_initialized():
        return
    pod = pod_contract()
    timeout = timedelta(seconds=recovery_settings().collective_init_timeout)
    device = pick_device(config, pod.local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if pod.process is None:
        # A lone process with no launcher: a private in-memory store.
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def gang_nodes(runtime: Runtime) -> list[GangNode]:
    """Each process's node (rank and name), by global rank."""
    pod = pod_contract()
    local_world = pod.process.local_world_size if pod.process else 1
    me = GangNode(node_rank_of(pod, runtime.rank, local_world), contract.node_name())
    return gather_gang_nodes(me, runtime.world_size)


def check_gang(
    config: TrainConfig, runtime: Runtime, gang: list[GangNode], metrics: TrainMetrics | None
) -> None:
    """The preflight check (raises PreflightFailed on a failed collective); rank 0
    publishes what it found."""
    if metrics:
        metrics.set_phase(contract.PHASE_PREFLIGHT)
    report = run_preflight(config.preflight, runtime, gang)
    if runtime.is_logger:
        publish(report, metrics, log_json if config.metrics.json_logs else _no_log)
    if metrics:
        metrics.set_phase(contract.PHASE_STARTING)


def _no_log(event: str, **fields: Any) -> None:
    """A log that writes nothing (metrics.jsonLogs off)."""


def report_in_place_restarts(
    config: TrainConfig, runtime: Runtime, metrics: TrainMetrics | None, reason: str | None
) -> None:
    """The gang's in-place restarts and the last one's reason, on every /metrics:
    the most any launcher counted, and the most telling reason any pod saw among
    its own workers (a killed worker's pod says so, its peers only lost a peer)."""
    reasons = contract.RESTART_REASONS
    mine = [contract.in_place_round(), reasons.index(reason) + 1 if reason else 0]
    agreed = torch.tensor(mine, dtype=torch.int64, device=runtime.device)
    if runtime.world_size > 1:
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    restarts, which = agreed.tolist()
    if restarts and runtime.local_rank == 0:
        leave_in_place_summary(restarts, reasons[which - 1] if which else None)
    if metrics:
        metrics.in_place_restarts.set(restarts)
        for index, each in enumerate(reasons, start=1):
            metrics.in_place_restart_reason.labels(each).set(1.0 if index == which else 0.0)
    if restarts and runtime.is_logger and config.metrics.json_logs:
        last = reasons[which - 1] if which else None
        log_json("in_place_restart", restarts=restarts, reason=last)


def leave_in_place_summary(restarts: int, reason: str | None) -> None:
    """The gang's in-place count in this pod's termination message, for the
    operator to count a round whose scrape it missed. Only in a container that
    has the file (the kubelet makes it): outside one there is no operator."""
    path = Path(pod_contract().termination_message_path)
    if path.is_file():
        counts = {contract.REPORTED_IN_PLACE_RESTARTS: restarts}
        termination.update(path, counts | {contract.REPORTED_IN_PLACE_REASON: reason})


def run_worker(config: TrainConfig, restart_reason: str | None = None) -> RunResult:
    """One training process: process group, metrics server, loop, clean shutdown.
    ``restart_reason``: why this pod's workers of the previous in-place round failed."""
    init_distributed(config)
    try:
        runtime = build_runtime(config)
        timeouts = CollectiveTimeouts(recovery_settings(), runtime.device)
        timeouts.start_generous()  # the mesh's groups too, which do not inherit it
        metrics = None
        if config.metrics.enabled and runtime.local_rank == 0:
            metrics = TrainMetrics()  # served once the run has resumed (Trainer.run)
        report_in_place_restarts(config, runtime, metrics, restart_reason)
        gang = gang_nodes(runtime)
        if config.preflight.enabled and runtime.world_size > 1:
            check_gang(config, runtime, gang, metrics)
        port = resolve_metrics_port(config, pod_contract()) if metrics else None
        return Trainer(config, runtime, metrics, port, gang, timeouts).run()
    finally:
        dist.destroy_process_group()
