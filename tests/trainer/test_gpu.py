"""GPU checks (tier 5): NCCL, bf16, FSDP2 mixed precision, torch.compile, flash SDPA,
checkpoint resume on CUDA, activation checkpointing under compile, the FSDP2
memory mode and CUDA graphs.

Skipped without CUDA; run on one GPU with ``pytest -m gpu tests/trainer/test_gpu.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_contract import pod as contract
from torchfleet_trainer.metrics import no_peak_message

if TYPE_CHECKING:
    from torchfleet_trainer.train import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_flash_attention_serves_the_models_attention() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torchfleet_trainer.models.common import Attention

    attention = Attention(dim=256, heads=4, kv_heads=4, bias=False, dropout=0.0).cuda()
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = attention(x)  # raises if flash attention cannot run these inputs
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_fsdp2_mixed_precision_computes_in_bf16_keeps_fp32_master_weights() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchfleet_contract.trainer_config import ModelConfig
    from torchfleet_trainer.distributed.data_parallel import apply_fsdp
    from torchfleet_trainer.models import build_model

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        with torch.device("cuda"):
            model = build_model(ModelConfig(layers=2, dim=128, heads=4), vocab_size=64)
        apply_fsdp(model, mesh, torch.bfloat16, reshard_after_forward=True)
        seen: list[torch.dtype] = []
        model.layers["0"].attention.wq.register_forward_hook(
            lambda mod, args, out: seen.append(out.dtype)
        )
        logits = model(torch.randint(0, 64, (2, 32), device="cuda"))
        logits.float().sum().backward()
        assert seen == [torch.bfloat16]
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_nccl_bf16_compiled_training_runs_and_checkpoints(tmp_path: Path) -> None:
    config = {
        "model": {
            "architecture": "llama",
            "layers": 2,
            "heads": 4,
            "kvHeads": 2,
            "dim": 128,
            "maxSeqLen": 128,
            "vocabSize": 64,
        },
        "data": {"kind": "synthetic", "seqLen": 128, "syntheticTokens": 100_000},
        "training": {
            "steps": 30,
            "globalBatchSize": 8,
            "device": "cuda",
            "precision": "bf16",
            "compile": True,
            "logInterval": 10,
            "evalInterval": 0,
        },
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval": 10},
        "metrics": {"port": 0},
    }
    env = {contract.TRAIN_CONFIG: json.dumps(config), contract.MASTER_PORT: str(free_port())}
    trainer = TrainerProcess([], env)
    assert trainer.finish(timeout=600) == 0, trainer.stderr[-3000:]
    steps = trainer.of("step")
    assert [s["step"] for s in steps] == [10, 20, 30]
    # Reported, to significant digits (a model this small is far below 1e-4).
    assert all("mfu" in s for s in steps), no_peak_message(torch.cuda.get_device_name())
    assert all(0 < s["mfu"] < 1 for s in steps), steps
    assert (tmp_path / "ckpt" / "step-00000030" / "COMPLETE").is_file()


# ---- the trainer in this process, on one GPU --------------------------------------

# A small llama on learnable tokens; bf16, as a GPU run defaults to.
SMALL_GPU_MODEL = [
    "model.architecture=llama",
    "model.layers=4",
    "model.dim=128",
    "model.heads=4",
    "model.kvHeads=2",
    "model.maxSeqLen=64",
    "model.vocabSize=64",
    "data.kind=tokens",
    "data.seqLen=64",
    "training.globalBatchSize=16",
    "training.device=cuda",
    "training.precision=bf16",
    "training.evalInterval=0",
    "training.logInterval=1",
    "optimizer.lr=0.003",
    "schedule.warmupSteps=2",
    # Fixed, so a run stopped at a checkpoint had the uninterrupted run's rates.
    "schedule.decaySteps=8",
    "checkpoint.enabled=false",
    "metrics.enabled=false",
    "metrics.jsonLogs=false",
    "tensorboard.enabled=false",
]
STEPS = 8
# Two bf16 runs of different kernels (compiled or not, autocast or FSDP's policy)
# drift apart by a few 1e-3 over these steps (on CPU: FSDP's policy 0.004 from
# autocast, fp32 0.0015); the loss falls 0.06-0.4 per step, so a lost or doubled
# update or a wrong batch is far outside this.
BF16_LOSS_TOL = 0.02


@pytest.fixture
def nccl_one_rank() -> Iterator[None]:
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    from tests.trainer.test_strategies import learnable_tokens

    return learnable_tokens(tmp_path / "tokens.bin")


def gpu_trainer(tokens: Path, *extra: str) -> Trainer:
    from torchfleet_contract.trainer_config import load_config
    from torchfleet_trainer.train import Trainer, build_runtime

    torch._dynamo.reset()
    overrides = [*SMALL_GPU_MODEL, f"data.path={tokens}", f"training.steps={STEPS}", *extra]
    config = load_config(overrides=overrides, env={})
    return Trainer(config, build_runtime(config))


def losses(trainer: Trainer) -> list[float]:
    result = trainer.run()
    assert result.last_step == trainer.config.training.steps
    return [record["loss"] for record in result.history]


def assert_tracks(got: list[float], expected: list[float], tol: float = BF16_LOSS_TOL) -> None:
    assert len(got) == len(expected)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= tol, (got, expected)
    assert got[-1] < got[0] - 1.0, f"did not learn: {got}"


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer state tensor, copied to the host."""
    from torch.distributed.tensor import DTensor

    state: dict[str, torch.Tensor] = {}
    for name, tensor in trainer.model.parts[0].state_dict().items():
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        state[f"model.{name}"] = whole.detach().cpu().clone()
    for index, per_param in trainer.optimizers[0].state_dict()["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                whole = value.full_tensor() if isinstance(value, DTensor) else value
                state[f"optim.{index}.{key}"] = whole.detach().cpu().clone()
    return state


def test_checkpoint_resume_on_cuda_is_bit_identical(
    nccl_one_rank: None, tokens: Path, tmp_path: Path
) -> None:
    saved = 4
    checkpoint = [
        "checkpoint.enabled=true",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        f"checkpoint.interval={saved}",
    ]
    first = gpu_trainer(tokens, *checkpoint, f"training.steps={saved}")
    before = losses(first)
    expected = snapshot(first)
    position = first.sampler.state_dict()

    resumed = gpu_trainer(tokens, *checkpoint)
    assert resumed.resume() == saved
    got = snapshot(resumed)
    assert sorted(got) == sorted(expected)
    different = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not different, f"not bit-identical after load: {different[:5]}"
    assert resumed.sampler.state_dict() == position

    # Going on from there trains like the uninterrupted run.
    after = losses(gpu_trainer(tokens, *checkpoint))
    whole = losses(gpu_trainer(tokens))
    assert_tracks(before + after, whole, tol=1e-3)


def test_activation_checkpointing_under_compile_trains_like_eager(
    nccl_one_rank: None, tokens: Path
) -> None:
    eager = losses(gpu_trainer(tokens))
    trainer = gpu_trainer(tokens, "training.compile=true", "training.activationCheckpointing=full")
    assert trainer.model.compiled_loss is not None, "one process compiles the whole model"
    assert_tracks(losses(trainer), eager)


def test_fsdp_memory_mode_wraps_and_trains_like_the_default(
    nccl_one_rank: None, tokens: Path
) -> None:
    from torch.distributed.fsdp import FSDPModule

    default = gpu_trainer(tokens)
    assert not isinstance(default.model.parts[0], FSDPModule)
    default_losses = losses(default)
    fsdp = gpu_trainer(tokens, "parallel.fsdpMemorySaving=true")
    assert isinstance(fsdp.model.parts[0], FSDPModule) and fsdp.model.autocast_dtype is None
    assert_tracks(losses(fsdp), default_losses)


def test_cuda_graphs_on_and_off_give_the_same_losses(nccl_one_rank: None, tokens: Path) -> None:
    from torchfleet_contract.trainer_config import ConfigError

    compiled = losses(gpu_trainer(tokens, "training.compile=true"))
    graphs = gpu_trainer(tokens, "training.compile=true", "training.cudaGraphs=true")
    assert graphs.model.cuda_graphs
    # The same compiled kernels, replayed: equal up to reduction-order noise.
    assert_tracks(losses(graphs), compiled, tol=1e-3)
    with pytest.raises(ConfigError, match=r"training\.cudaGraphs: needs one process without FSDP"):
        gpu_trainer(
            tokens,
            "training.compile=true",
            "training.cudaGraphs=true",
            "parallel.fsdpMemorySaving=true",
        )
