"""User models (``model.importPath``) the trainer tests build, in a module the
torchrun workers can import."""

from __future__ import annotations

import torch
from torch import nn

from torchfleet_contract.trainer_config import ModelConfig

# A model and data this small build and train in well under a second on CPU.
SMALL = [
    "model.layers=2",
    "model.dim=16",
    "model.heads=2",
    "model.maxSeqLen=8",
    "model.vocabSize=32",
    "data.seqLen=8",
    "data.syntheticTokens=4096",
]


# The built-in llama at its smallest: two blocks, 16-token sequences.
TINY_LLAMA = [
    "model.architecture=llama",
    "model.layers=2",
    "model.dim=32",
    "model.heads=2",
    "model.maxSeqLen=16",
    "data.seqLen=16",
    "training.globalBatchSize=4",
]


class MaskedMixer(nn.Module):
    """A user model of plain layers and a causal-mask buffer that is not saved."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.vocab_size is not None
        dim, seq = config.dim, config.max_seq_len
        self.embedding = nn.Embedding(config.vocab_size, dim)
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, config.vocab_size)
        self.register_buffer("mask", torch.ones(seq, seq).tril().bool(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embedding(tokens))
        seq = tokens.shape[1]
        scores = (h @ h.transpose(1, 2)).masked_fill(~self.mask[:seq, :seq], float("-inf"))
        return self.output(self.mix(scores.softmax(-1) @ h))
