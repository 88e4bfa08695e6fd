"""A scenario's ``[model]`` table: a catalog ``id``, a Hugging Face ``hf_config`` or the inline
sizes (`ModelSection`), and the `ModelSpec` the inline form builds (`inline_model`);
`simulator.scenario.resolve_model` picks the form.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import ConfigError, pydantic_msg
from simulator.model_shapes import ShapeError
from simulator.models import ModelSpec

# strict: a TOML ``true`` or ``2.0`` is not a GPU count, nor ``"yes"`` a switch
_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)


class ModelSection(BaseModel):
    """The model: exactly one of ``id``, ``hf_config`` or the inline sizes."""

    model_config = _FROZEN
    id: str | None = Field(
        default=None,
        description="a catalog model (`tilesim list models`) or a model .toml / HF .json path "
        "(relative to the scenario's folder, else to the current folder)",
    )
    hf_config: str | None = Field(
        default=None,
        description="a Hugging Face config.json or model .toml (a path, as id's)",
    )
    n_layers: int | None = Field(default=None, gt=0, description="inline: transformer layers")
    hidden_size: int | None = Field(default=None, gt=0, description="inline: model width")
    n_heads: int | None = Field(default=None, gt=0, description="inline: attention heads")
    n_kv_heads: int | None = Field(
        default=None, gt=0, description="inline: key/value heads (grouped-query attention)"
    )
    ffn_hidden_size: int | None = Field(
        default=None, gt=0, description="inline: MLP width (default 4 x hidden_size)"
    )
    vocab_size: int | None = Field(default=None, gt=0, description="inline: vocabulary")
    activation: Literal["gelu", "swiglu", "squared-relu"] = Field(
        default="gelu", description="inline: MLP activation (squared-relu is priced as relu)"
    )
    num_experts: int = Field(default=1, gt=0, description="inline: MoE experts per layer")
    experts_per_token: int = Field(default=1, gt=0, description="inline: MoE top-k routing")
    seq_len: int = Field(gt=0, description="tokens per sequence (all three forms)")


INLINE_KEYS = (
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "activation",
    "num_experts",
    "experts_per_token",
)


def inline_model(m: ModelSection, name: str) -> ModelSpec:
    """The `ModelSpec` of an inline ``[model]`` table named ``name``."""
    sizes = (m.n_layers, m.hidden_size, m.n_heads, m.vocab_size)
    if any(x is None for x in sizes):
        raise ConfigError("model: give id, hf_config, or n_layers/hidden_size/n_heads/vocab_size")
    h = int(m.hidden_size or 0)
    swiglu = m.activation == "swiglu"
    fields: dict[str, Any] = {
        "id": name,
        "architecture": "llama" if swiglu else "gpt2",
        "num_layers": m.n_layers,
        "hidden_size": h,
        "ffn_hidden_size": m.ffn_hidden_size or 4 * h,
        "num_heads": m.n_heads,
        "num_kv_heads": m.n_kv_heads or 0,
        "vocab_size": m.vocab_size,
        "max_positions": m.seq_len,
        "activation": {"gelu": "gelu", "swiglu": "swiglu", "squared-relu": "relu"}[m.activation],
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
    }
    if swiglu:
        fields |= {"norm": "rmsnorm", "position": "rotary", "bias": False}
        fields |= {"tied_embeddings": False}
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as e:  # named by the table's key ("model: 7 heads ..." named none)
        first = e.errors()[0]
        error = first.get("ctx", {}).get("error")
        field = error.field if isinstance(error, ShapeError) else str(first["loc"][0])
        key = INLINE_KEY_OF.get(field, field)
        raise ConfigError(f"model.{key}: {pydantic_msg(first)}") from e


# `ModelSpec` field -> the inline [model] key that sets it, where the names differ
INLINE_KEY_OF = {"num_layers": "n_layers", "num_heads": "n_heads", "num_kv_heads": "n_kv_heads"}
