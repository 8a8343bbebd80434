"""A nanoGPT-style GPT: LayerNorm, GELU MLP, learned positions, dropout."""

from __future__ import annotations

import torch
from torch import nn

from torchfleet_contract.trainer_config import ModelConfig
from torchfleet_trainer.models.common import Attention, Decoder


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool, dropout: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w2(nn.functional.gelu(self.w1(x))))


class GPTBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.dim
        self.attention_norm = nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)
        self.attention = Attention(dim, config.heads, config.heads, config.bias, config.dropout)
        self.attention_dropout = nn.Dropout(config.dropout)
        self.ffn_norm = nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)
        hidden = config.ffn_hidden or 4 * dim
        self.feed_forward = MLP(dim, hidden, config.bias, config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention_dropout(self.attention(self.attention_norm(x)))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(Decoder):
    pos_embeddings: nn.Embedding | None

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        blocks: list[nn.Module] = [GPTBlock(config) for _ in range(config.layers)]
        norm = nn.LayerNorm(config.dim, eps=config.norm_eps, bias=config.bias)
        super().__init__(vocab_size, config.dim, blocks, norm)
        self.pos_embeddings = nn.Embedding(config.max_seq_len, config.dim)
        self.embedding_dropout = nn.Dropout(config.dropout)
        if config.tie_embeddings:
            assert self.output is not None and self.tok_embeddings is not None
            self.output.weight = self.tok_embeddings.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.tok_embeddings is not None and self.pos_embeddings is not None
        # Positions shaped (1, seq) so the embedding's sequence dim is dim 1, like tokens'.
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        return self.embedding_dropout(self.tok_embeddings(tokens) + self.pos_embeddings(positions))
