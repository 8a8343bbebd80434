"""GPU checks (tier 5): NCCL, bf16, FSDP2 mixed precision, torch.compile, flash SDPA.

Skipped without CUDA; run on one GPU with ``pytest -m gpu tests/trainer/test_gpu.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.cli_process import TrainerProcess, free_port
from torchfleet_trainer import contract

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

    from torchfleet_trainer.config import ModelConfig
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
    assert all(s.get("mfu", 0) > 0 for s in steps)
    assert (tmp_path / "ckpt" / "step-00000030" / "COMPLETE").is_file()
