"""The per-family MLP: dimensionless tile features -> log(latency / base time).

Inputs are standardised with statistics stored in the module's buffers, so a saved
state dict is the whole model. The output is a log ratio; `TileMLP.ratio` exponentiates.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own alias)
from torch import nn


class TileMLP(nn.Module):
    """A small MLP with input standardisation; predicts log(latency / base time)."""

    mean: torch.Tensor
    std: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def __init__(self, n_features: int, *, hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("lo", torch.full((n_features,), -torch.inf))
        self.register_buffer("hi", torch.full((n_features,), torch.inf))
        dims = [n_features, *([hidden] * layers)]
        blocks: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            blocks += [nn.Linear(a, b), nn.SiLU()]
        blocks.append(nn.Linear(dims[-1], 1))
        self.net = nn.Sequential(*blocks)

    def set_scaling(self, x: torch.Tensor) -> None:
        """Take input standardisation and the training range from training features.

        Inputs are clamped to the training range at prediction time: a GPU or shape beyond
        what was trained on is treated as the nearest trained case, not extrapolated.
        """
        self.mean.copy_(x.mean(dim=0))
        self.std.copy_(x.std(dim=0).clamp_min(1e-3))
        self.lo.copy_(x.min(dim=0).values)
        self.hi.copy_(x.max(dim=0).values)

    def _standardised(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs clamped to the training range, then standardised."""
        return (torch.minimum(torch.maximum(x, self.lo), self.hi) - self.mean) / self.std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log ratio of latency to base time, shape (n,)."""
        return self.net(self._standardised(x)).squeeze(-1)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` without gradients, bit for bit: the same products in functional calls,
        SiLU in place (module calls and fresh SiLU outputs were a fifth of a 100k-kernel
        forecast). Call it under ``torch.no_grad()``."""
        z = self._standardised(x)
        for layer in self.net:  # Linear and SiLU only (`__init__`)
            if isinstance(layer, nn.Linear):
                z = F.linear(z, layer.weight, layer.bias)
            else:
                z = F.silu(z, inplace=True)
        return z.squeeze(-1)


class TileEnsemble(nn.Module):
    """Members trained from different seeds; predicts the mean of their log ratios.

    With five training GPUs a single MLP's extrapolation to a new GPU varies a lot with its
    seed; the mean of a few members varies far less.
    """

    def __init__(self, n_features: int, *, members: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(TileMLP(n_features) for _ in range(members))

    @property
    def lo(self) -> torch.Tensor:
        """Lower edge of the training range of the inputs."""
        first: TileMLP = self.members[0]  # type: ignore[assignment]
        return first.lo

    @property
    def hi(self) -> torch.Tensor:
        """Upper edge of the training range of the inputs."""
        first: TileMLP = self.members[0]  # type: ignore[assignment]
        return first.hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Mean log ratio over the members, shape (n,)."""
        return torch.stack([m(x) for m in self.members]).mean(dim=0)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` without gradients, the same for a row whatever rows share its batch:
        the rows go through in blocks of `PREDICT_ROWS`, the last one padded, because a CPU
        matrix product picks its kernel by the number of rows, and so the last bits of a
        kernel's forecast depended on how many kernels were forecast with it."""
        n = x.shape[0]
        pad = -n % PREDICT_ROWS
        blocks = torch.cat([x, x.new_zeros((pad, x.shape[1]))]).split(PREDICT_ROWS)
        members: list[TileMLP] = list(self.members)  # type: ignore[arg-type]
        with torch.no_grad():
            means = [torch.stack([m.infer(b) for m in members]).mean(dim=0) for b in blocks]
        return torch.cat(means)[:n]


# Rows of every block `TileEnsemble.predict` forecasts. Fewer, larger calls: two intra-op
# threads share a 4,096-row block's products and SiLUs far better than a 1,024-row block's
# (the ~364k rows of a 100k-kernel call: 0.84-1.06 -> 0.58-0.74 s with two threads, 1.3-1.6 ->
# 0.94-1.02 s with one), but a call of a few kernels computes one whole block: 10-13 ms a
# family instead of 3-4 (benchmarks/e2e_speed.py cold ~50 -> ~110 ms). Blocks of 32 to 16,384
# rows (multiples of 32) gave these weights the same bits on this AVX2 CPU at one and two
# threads; the last rows of a 1,000-row batch did not.
PREDICT_ROWS = 4096
