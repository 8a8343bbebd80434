"""Builds tied-embedding models under torchrun and reports whether the tie held.

``python tie_worker.py OUT LAYOUT_JSON``: LAYOUT_JSON maps a layout name to its
config overrides; each is built (meta-device init forced), checked, trained
two steps and checked again. Rank 0 writes ``{layout: facts}`` to OUT.
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

from torchfleet_trainer.config import load_config
from torchfleet_trainer.train import Trainer, build_runtime

MODEL = [
    "model.architecture=gpt",
    "model.layers=2",
    "model.dim=16",
    "model.heads=2",
    "model.maxSeqLen=8",
    "model.vocabSize=32",
    "model.tieEmbeddings=true",
    "data.seqLen=8",
    "data.syntheticTokens=4096",
    "training.steps=2",
    "training.globalBatchSize=4",
    "training.evalInterval=0",
    "training.metaDeviceInit=always",
    "optimizer.lr=0.05",
    "checkpoint.enabled=false",
    "metrics.enabled=false",
    "metrics.jsonLogs=false",
]


def local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def tie_facts(model: nn.Module) -> dict[str, Any]:
    embedding, output = model.tok_embeddings.weight, model.output.weight
    return {
        "same_parameter": output is embedding,
        "same_storage": local(output).data_ptr() == local(embedding).data_ptr(),
        "equal": torch.equal(local(output), local(embedding)),
        "parameters": len(list(model.parameters())),
    }


def check(overrides: list[str], distributed: bool) -> dict[str, Any]:
    config = load_config(overrides=[*MODEL, *overrides], env={})
    trainer = Trainer(config, build_runtime(config, distributed=distributed))
    (model,) = trainer.model.parts
    initial = local(model.tok_embeddings.weight).detach().clone()
    before = tie_facts(model)
    result = trainer.run()
    after = tie_facts(model)
    return {
        "before": before,
        "after": after,
        "trained": not torch.equal(local(model.tok_embeddings.weight), initial),
        "losses_finite": all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history),
    }


def main() -> None:
    out, layouts = Path(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    results: dict[str, Any] = {}
    try:
        for name, overrides in layouts.items():
            if name == "single":
                facts = check(overrides, distributed=False) if dist.get_rank() == 0 else None
                dist.barrier()
            else:
                facts = check(overrides, distributed=True)
            results[name] = facts
    finally:
        dist.destroy_process_group()
    if results.get("single") is not None:
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
