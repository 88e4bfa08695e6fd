"""The rules a `ModelSpec`'s sizes follow, and `ShapeError`, which names the field to change.

`ModelSpec` checks them after its fields (`check_shapes`); `model_files.validate_model` reports a
broken one as one line naming the field, or the HF config's own key for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.models import ModelSpec

# One expert FFN op per local expert in the op list: 2^16 experts price a step in about
# 0.1 s, 10^6 took over a minute and 2^63 overflowed; the largest MoE models have a few
# thousand (Switch-C: 2,048, Fedus et al. 2021)
MAX_EXPERTS = 2**16
# Widths and counts far past any published transformer (widest hidden 25,600, FFN 3.5x that;
# deepest 126 layers; most heads 128), so that a typo (hidden_size = 1e12) is refused rather
# than forecast in 10^23 s. The vocabulary is left open: a huge one is a layout that does
# not fit, which `simulate` and `sweep` report as such.
MAX_SIZES = {
    "hidden_size": 2**20,
    "ffn_hidden_size": 2**22,
    "head_dim": 2**20,
    "num_layers": 2**16,
    "num_encoder_layers": 2**16,
    "num_heads": 2**16,
    "num_kv_heads": 2**16,
}


class ShapeError(ValueError):
    """Sizes that do not fit together; ``field`` is the one to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_shapes(m: ModelSpec) -> None:
    """A `ShapeError` for the first rule ``m`` breaks: the heads divide the width and the kv
    heads the heads, only Switch alternates dense and expert layers, only OPT projects its
    embeddings, ``local_experts`` is the simulator's to set, and the expert counts are bounded."""
    _check_sizes(m)
    _check_heads(m)
    _check_architecture(m)
    _check_experts(m)


def _check_sizes(m: ModelSpec) -> None:
    for field, most in MAX_SIZES.items():
        if getattr(m, field) > most:
            raise ShapeError(
                field,
                f"{field} = {getattr(m, field):,} is past any transformer modelled here; "
                f"use at most {most:,}",
            )


def _check_heads(m: ModelSpec) -> None:
    h, heads, kv = m.hidden_size, m.num_heads, m.num_kv_heads
    if not m.head_dim and h % heads:
        raise ShapeError(
            "num_heads",
            f"{heads} heads do not divide the hidden size {h}; use a divisor of {h}",
        )
    if kv and heads % kv:
        raise ShapeError(
            "num_kv_heads",
            f"{kv} key/value heads do not divide the {heads} attention heads; "
            f"use a divisor of {heads}",
        )


def _check_architecture(m: ModelSpec) -> None:
    """What only one architecture does here: Switch's dense layers between expert layers,
    OPT's embedding projections."""
    if m.num_experts > 1 and m.moe_every > 1 and m.architecture != "switch":
        raise ShapeError(
            "moe_every",
            f"{m.moe_every}: only Switch models alternate dense and expert layers here; "
            f"{m.architecture} models put experts in every layer: use moe_every = 1",
        )
    if m.embed_dim not in (0, m.hidden_size) and m.architecture != "opt":
        raise ShapeError(
            "embed_dim",
            f"{m.embed_dim} differs from the hidden size {m.hidden_size}: only OPT models "
            f"project their embeddings here; use embed_dim = 0",
        )


def _check_experts(m: ModelSpec) -> None:
    if m.local_experts:  # set on a shard by `model_copy`, which skips this check
        raise ShapeError(
            "local_experts",
            f"{m.local_experts}: the simulator sets it on each expert-parallel shard "
            "(num_experts / run.ep); remove it and choose run.ep",
        )
    if m.num_experts > MAX_EXPERTS:
        raise ShapeError(
            "num_experts",
            f"{m.num_experts} experts: at most {MAX_EXPERTS} (2^16) per layer are "
            f"modelled; set num_experts to {MAX_EXPERTS} or fewer",
        )
    if m.experts_per_token > m.num_experts:
        raise ShapeError(
            "experts_per_token",
            f"{m.experts_per_token} experts per token exceed the {m.num_experts} "
            f"experts; use at most {m.num_experts}",
        )
