"""A GPT-2-style model in plain torch: ``tilesim predict --module examples/gpt2_module.py:build``.

Token and position embeddings, pre-LN blocks (one fused qkv projection, causal
``masked_fill``, softmax, ``GELU(approximate="tanh")`` MLP), a final layer norm and an
untied ``lm_head`` without bias. The sizes default to GPT-2 medium; ``build(batch, seq)``
returns the module and its inputs (tilesim calls it under ``torch.device("meta")``). ``seq``
may not exceed the position table (1024; 256 for ``build_small``): the forward fails otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of the model."""

    layers: int = 24
    hidden: int = 1024
    heads: int = 16
    vocab: int = 50257
    positions: int = 1024
    dropout: float = 0.1


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused qkv projection."""

    future: torch.Tensor  # the causal mask, a buffer

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        future = torch.ones(cfg.positions, cfg.positions, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / d**0.5
        scores = scores.masked_fill(self.future[:s, :s], float("-inf"))
        probs = self.attn_drop(torch.softmax(scores, dim=-1))
        out = (probs @ v).transpose(1, 2).contiguous().view(b, s, h)
        return self.resid_drop(self.proj(out))


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden, 4 * cfg.hidden),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.hidden, cfg.hidden),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Embeddings, blocks, final layer norm, language-model head."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.positions, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build(
    batch: int, seq: int, cfg: GPT2Config | None = None
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model and one batch of token ids (on the current default device)."""
    cfg = cfg or GPT2Config()
    ids = torch.zeros(batch, seq, dtype=torch.long)
    return GPT2(cfg), (ids,)


def build_small(batch: int, seq: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A 2-layer, 128-wide variant (tests, quick looks); ``seq`` at most 256."""
    return build(batch, seq, GPT2Config(layers=2, hidden=128, heads=4, vocab=1000, positions=256))
