"""A Llama-style model: RMSNorm, rotary positions, SwiGLU, grouped-query attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchfleet_contract.trainer_config import ModelConfig
from torchfleet_trainer.models.common import Attention, Decoder, rope_table


def swiglu_hidden(dim: int, multiple_of: int = 64) -> int:
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.dim
        self.attention_norm = nn.RMSNorm(dim, eps=config.norm_eps)
        self.attention = Attention(dim, config.heads, config.n_kv_heads, False, config.dropout)
        self.ffn_norm = nn.RMSNorm(dim, eps=config.norm_eps)
        self.feed_forward = SwiGLU(dim, config.ffn_hidden or swiglu_hidden(dim))

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope=rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(Decoder):
    rope: torch.Tensor

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        blocks: list[nn.Module] = [LlamaBlock(config) for _ in range(config.layers)]
        super().__init__(
            vocab_size, config.dim, blocks, nn.RMSNorm(config.dim, eps=config.norm_eps)
        )
        self.config = config
        # Derived from the config, so not saved in checkpoints.
        self.register_buffer("rope", self._rope_table(), persistent=False)
        if config.tie_embeddings:
            assert self.output is not None and self.tok_embeddings is not None
            self.output.weight = self.tok_embeddings.weight

    def _rope_table(self) -> torch.Tensor:
        head_dim = self.config.dim // self.config.heads
        return rope_table(head_dim, self.config.max_seq_len, self.config.rope_theta)

    def block_kwargs(self) -> dict[str, torch.Tensor]:
        return {"rope": self.rope}

    def init_buffers(self) -> None:
        self.rope = self._rope_table().to(self.rope.device)
