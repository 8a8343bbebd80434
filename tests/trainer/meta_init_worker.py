"""Builds models with meta-device init under torchrun and reports what came out.

``python meta_init_worker.py OUT LAYOUTS_JSON``: LAYOUTS_JSON maps a layout
name to ``{"check": "tie" | "direct", "overrides": [...]}``; a layout named
``single*`` runs on rank 0 alone without parallelism. Each model is built
with meta-device init forced on CPU, checked, trained two steps and (for
"tie") checked again. Rank 0 writes ``{layout: facts}`` to OUT.

* "tie": the built-in GPT with tieEmbeddings: is the output projection still
  the token embedding (one parameter, one storage) before and after training?
* "direct": the user model of tests/trainer/user_models.py: does every
  parameter and buffer, gathered whole, equal a direct build with the same seed?
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tests.trainer.user_models import SMALL, MaskedMixer
from torchfleet_contract.trainer_config import TrainConfig, load_config
from torchfleet_trainer.train import Trainer, build_runtime

COMMON = [
    *SMALL,
    "training.steps=2",
    "training.globalBatchSize=4",
    "training.evalInterval=0",
    "training.metaDeviceInit=always",
    "optimizer.lr=0.05",
    "checkpoint.enabled=false",
    "metrics.enabled=false",
    "metrics.jsonLogs=false",
]
TIED = ["model.architecture=gpt", "model.tieEmbeddings=true"]
USER = [f"model.importPath={MaskedMixer.__module__}:MaskedMixer"]


def local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def tie_facts(model: nn.Module) -> dict[str, Any]:
    embedding, output = model.tok_embeddings.weight, model.output.weight
    return {
        "same_parameter": output is embedding,
        "same_storage": local(output).data_ptr() == local(embedding).data_ptr(),
        "equal": torch.equal(local(output), local(embedding)),
        "parameters": len(list(model.parameters())),
    }


def check_tie(trainer: Trainer, model: nn.Module) -> dict[str, Any]:
    initial = local(model.tok_embeddings.weight).detach().clone()
    before = tie_facts(model)
    result = trainer.run()
    return {
        "before": before,
        "after": tie_facts(model),
        "trained": not torch.equal(local(model.tok_embeddings.weight), initial),
        "losses_finite": all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history),
    }


def check_direct(config: TrainConfig, model: nn.Module) -> dict[str, Any]:
    torch.manual_seed(config.training.seed)
    direct = MaskedMixer(config.model)
    expected = dict(direct.named_parameters()) | dict(direct.named_buffers())
    got = dict(model.named_parameters()) | dict(model.named_buffers())
    differing = [name for name, t in got.items() if not torch.equal(whole(t), expected[name])]
    return {"names": sorted(got), "expected_names": sorted(expected), "differing": differing}


def check(layout: dict[str, Any], distributed: bool) -> dict[str, Any]:
    extra = TIED if layout["check"] == "tie" else USER
    config = load_config(overrides=[*COMMON, *extra, *layout["overrides"]], env={})
    trainer = Trainer(config, build_runtime(config, distributed=distributed))
    (model,) = trainer.model.parts
    if layout["check"] == "tie":
        return check_tie(trainer, model)
    return check_direct(config, model)


def main() -> None:
    out, layouts = Path(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict[str, Any] = {}
    try:
        for name, layout in layouts.items():
            if name.startswith("single"):
                facts = check(layout, distributed=False) if rank == 0 else None
                dist.barrier()
            else:
                facts = check(layout, distributed=True)
            results[name] = facts
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
