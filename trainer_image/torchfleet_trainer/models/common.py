"""Pieces both model families share: the decoder skeleton and attention.

The skeleton keeps its blocks in a ``ModuleDict`` keyed by layer index and
lets the embedding, final norm and output be ``None``. That way a pipeline
stage is this same class with some parts removed, and parameter names
(``layers.3.attention.wq.weight``) stay the same in every parallel layout,
which is what lets a checkpoint load into a different one. Nothing here knows
about parallelism.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Causal self-attention through scaled_dot_product_attention.

    Separate q/k/v/o projections (rather than one fused qkv) so each can be
    split by heads from outside. Head counts come from the projection shapes at
    run time, so a module whose projections hold a subset of the heads still
    works.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        bias: bool,
        dropout: float,
    ) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=bias)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def rope_table(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """Cosines and sines of RoPE's rotation angles, shape (max_seq_len, head_dim/2, 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotates pairs of channels of x (batch, seq, heads, head_dim) by position."""
    seq = x.shape[1]
    cos = table[:seq, :, 0].view(1, seq, 1, -1)
    sin = table[:seq, :, 1].view(1, seq, 1, -1)
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


# Prefix activation checkpointing's wrapper adds to module names (the value of
# torch's _CHECKPOINT_PREFIX, which is private).
_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def plain_name(name: str) -> str:
    """A parameter or buffer name as in the plain model, wrappers' prefixes removed."""
    return name.replace(_CHECKPOINT_PREFIX, "")


def normal_by_name(param: torch.Tensor, std: float, seed: int, name: str) -> None:
    """Fills ``param`` from N(0, std) drawn by a generator keyed by (seed, name).

    The whole matrix is drawn and copied in, so a sharded parameter gets its
    part of the same values: the trainer runs ``init_weights`` so that copying
    a whole tensor into a shard keeps this rank's part
    (``distributed/materialize.py``); this module knows nothing of sharding.
    """
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    generator = torch.Generator(device=param.device).manual_seed(
        int.from_bytes(digest[:8], "little") >> 1
    )
    whole = torch.empty(param.shape, dtype=param.dtype, device=param.device)
    whole.normal_(0.0, std, generator=generator)
    param.copy_(whole)


def blocks_of(model: nn.Module) -> nn.ModuleDict | None:
    """The model's blocks when it follows the Decoder layout (``layers`` ModuleDict)."""
    layers = getattr(model, "layers", None)
    return layers if isinstance(layers, nn.ModuleDict) else None


class Decoder(nn.Module):
    """Embedding -> blocks -> norm -> output, any of which may be removed."""

    tok_embeddings: nn.Embedding | None
    norm: nn.Module | None
    output: nn.Linear | None

    def __init__(self, vocab_size: int, dim: int, blocks: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        # The whole model's depth, kept when pipeline stages drop layers.
        self.depth = len(blocks)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleDict({str(i): block for i, block in enumerate(blocks)})
        self.norm = norm
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.tok_embeddings is not None
        return self.tok_embeddings(tokens)

    def block_kwargs(self) -> dict[str, torch.Tensor]:
        return {}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Without an embedding this is a later pipeline stage and gets activations.
        h = self.embed(tokens) if self.tok_embeddings is not None else tokens
        extra = self.block_kwargs()
        for block in self.layers.values():
            h = block(h, **extra)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by depth.

        Each matrix draws from a generator of its own, seeded from the global
        seed (``torch.initial_seed()``) and its name, so it gets the same values
        in every layout: in the whole model, in a pipeline stage holding only
        some layers, or as an FSDP/TP shard (the whole matrix is drawn and this
        rank keeps its shard).
        """
        residual_std = std / math.sqrt(2 * self.depth)
        seed = torch.initial_seed()
        for wrapped_name, param in self.named_parameters():
            name = plain_name(wrapped_name)
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif "norm" in name:
                nn.init.ones_(param)
            else:
                spread = residual_std if name.endswith(("wo.weight", "w2.weight")) else std
                normal_by_name(param, spread, seed, name)
        self.init_buffers()

    def init_buffers(self) -> None:
        """Recomputes non-persistent buffers (after materialising from meta)."""

    def num_params(self, exclude_embeddings: bool = True) -> int:
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        return total
