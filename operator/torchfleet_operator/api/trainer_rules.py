"""CEL mirrors of the trainer config's own cross-field checks.

``TrainConfig`` (owned by the trainer package) checks these in Python; the CRD
generator attaches them to the embedded trainer schema so ``kubectl apply``
rejects the same configs. The embedded schema carries no defaults (the trainer
image owns them), so each rule reads an unset field as the model's default,
taken from the model itself rather than copied.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from torchfleet_contract.trainer_config import (
    BIN_SUFFIX,
    DataConfig,
    ModelConfig,
    ParallelConfig,
    TrainingConfig,
)


def or_default(path: str, model: type[BaseModel], field: str) -> str:
    """CEL for ``path.field``, or the model's default when the field is unset."""
    info = model.model_fields[field]
    wire = info.alias or field
    return f"{path}.?{wire}.orValue({json.dumps(info.default)})"


def _rule(cel: str, message: str, field_path: str | None = None) -> dict[str, str]:
    rule = {"rule": cel, "message": message}
    if field_path:
        rule["fieldPath"] = field_path
    return rule


def _model_rules() -> list[dict[str, str]]:
    dim = or_default("self", ModelConfig, "dim")
    heads = or_default("self", ModelConfig, "heads")
    arch = or_default("self", ModelConfig, "architecture")
    return [
        _rule(f"{dim} % {heads} == 0", "trainer.model.dim must be divisible by heads", ".dim"),
        _rule(
            f"!has(self.kvHeads) || {heads} % self.kvHeads == 0",
            "trainer.model.kvHeads must divide heads",
            ".kvHeads",
        ),
        _rule(
            f"{arch} != 'llama' || ({dim} / {heads}) % 2 == 0",
            "trainer.model: llama's RoPE needs an even head dimension (dim / heads)",
            ".dim",
        ),
    ]


def _data_rules() -> list[dict[str, str]]:
    kind = or_default("self", DataConfig, "kind")
    return [
        _rule(
            f"!({kind} in ['char', 'tokens']) || (has(self.path) && size(self.path) > 0)",
            "trainer.data.path is required when data.kind is char or tokens",
            ".path",
        )
    ]


def _training_rules() -> list[dict[str, str]]:
    batch = or_default("self", TrainingConfig, "global_batch_size")
    accum = or_default("self", TrainingConfig, "grad_accum_steps")
    compiled = or_default("self", TrainingConfig, "compile")
    graphs = or_default("self", TrainingConfig, "cuda_graphs")
    return [
        _rule(
            f"!{graphs} || {compiled}",
            "trainer.training.cudaGraphs needs training.compile=true (the graphs are "
            "captured from the compiled forward and backward)",
            ".cudaGraphs",
        ),
        _rule(
            f"!{graphs} || ({accum} == 1 && self.?microBatchSize.orValue({batch}) >= {batch})",
            "trainer.training.cudaGraphs cannot be used with gradient accumulation "
            "(gradAccumSteps > 1 or microBatchSize below globalBatchSize): the second "
            "micro-step would allocate .grad inside the captured graph",
            ".cudaGraphs",
        ),
        _rule(
            f"{batch} % {accum} == 0",
            "trainer.training.globalBatchSize must be divisible by gradAccumSteps",
            ".globalBatchSize",
        ),
        _rule(
            f"!has(self.microBatchSize) || {accum} == 1",
            "trainer.training.microBatchSize: set either microBatchSize or gradAccumSteps, "
            "not both",
            ".microBatchSize",
        ),
    ]


def _parallel_rules() -> list[dict[str, str]]:
    shard = or_default("self", ParallelConfig, "data_parallel_shard")
    return [
        _rule(
            f"{shard} != 0",
            "trainer.parallel.dataParallelShard must be -1 or >= 1",
            ".dataParallelShard",
        )
    ]


def _config_rules() -> list[dict[str, str]]:
    seq_len = or_default("self.?data", DataConfig, "seq_len")
    max_seq = or_default("self.?model", ModelConfig, "max_seq_len")
    heads = or_default("self.?model", ModelConfig, "heads")
    kv_heads = f"self.?model.?kvHeads.orValue({heads})"
    layers = or_default("self.?model", ModelConfig, "layers")
    tensor = or_default("self.?parallel", ParallelConfig, "tensor")
    pipeline = or_default("self.?parallel", ParallelConfig, "pipeline")
    schedule = or_default("self.?parallel", ParallelConfig, "pipeline_schedule")
    per_rank = or_default("self.?parallel", ParallelConfig, "stages_per_rank")
    stages = f"({pipeline} * ({schedule} == 'interleaved_1f1b' ? {per_rank} : 1))"
    builtin = "!has(self.model) || !has(self.model.importPath)"
    tied = or_default("self.?model", ModelConfig, "tie_embeddings")
    return [
        _val_split_rule(),
        _rule(
            f"{seq_len} <= {max_seq}",
            "trainer.data.seqLen must not exceed model.maxSeqLen",
            ".data",
        ),
        _rule(
            f"!({builtin}) || ({heads} % {tensor} == 0 && {kv_heads} % {tensor} == 0)",
            "trainer.parallel.tensor must divide model.heads and model.kvHeads",
            ".parallel",
        ),
        _rule(
            f"!{tied} || ({tensor} == 1 && {pipeline} == 1)",
            "trainer.model.tieEmbeddings cannot be used with parallel.tensor or "
            "parallel.pipeline > 1",
            ".model",
        ),
        _rule(
            f"{stages} <= {layers}",
            "trainer.parallel: pipeline stages (pipeline x stagesPerRank) exceed model.layers",
            ".parallel",
        ),
    ]


def _val_split_rule() -> dict[str, str]:
    """Mirrors ``DataConfig.splits_tail``: valFraction 0 leaves a text file or a single
    .bin file without a validation split, which evaluation needs."""
    evaluates = f"{or_default('self.?training', TrainingConfig, 'eval_interval')} > 0"
    kind = or_default("self.?data", DataConfig, "kind")
    path = "self.?data.?path.orValue('')"
    splits_tail = f"({kind} == 'char' || ({kind} == 'tokens' && {path}.endsWith('{BIN_SUFFIX}')))"
    empty = f"{or_default('self.?data', DataConfig, 'val_fraction')} == 0.0"
    return _rule(
        f"!({evaluates} && {empty} && {splits_tail})",
        "trainer.data.valFraction 0 leaves no validation split for evaluation: set "
        "valFraction > 0 or training.evalInterval 0",
        ".data",
    )


def trainer_rules() -> dict[tuple[str, ...], list[dict[str, str]]]:
    """Rules by schema path below ``spec.trainer`` (() is the trainer object)."""
    return {
        (): _config_rules(),
        ("model",): _model_rules(),
        ("data",): _data_rules(),
        ("training",): _training_rules(),
        ("parallel",): _parallel_rules(),
    }


def attach(trainer_schema: dict[str, Any]) -> None:
    """Adds the rules to a structural trainer schema in place."""
    for path, rules in trainer_rules().items():
        node = trainer_schema
        for part in path:
            node = node["properties"][part]
        node.setdefault("x-kubernetes-validations", []).extend(rules)
