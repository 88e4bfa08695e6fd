"""Model architectures: `ModelSpec` and `load_model` (catalog TOML id, TOML path or HF config).

A model is architecture only (no batch, no parallelism). Catalog files live in
``simulator/data/models/<id>.toml``; Hugging Face ``config.json`` files are read from a path or,
by name, from the NeuSight ``models/`` folder (``gpt2_large`` -> ``models/gpt2_large.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import ConfigError
from simulator.model_shapes import check_shapes

CATALOG_DIR = Path(__file__).parent / "data" / "models"
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "neusight"

Architecture = Literal["gpt2", "opt", "bert", "switch", "llama", "mixtral"]
Activation = Literal["gelu", "gelu_new", "relu", "swiglu"]


# Tokens a sequence: far past any model's context; the causal attention's cost keeps a list
# per row block, and 1e11 tokens ran out of memory (`tilesim simulate`, serve, predict).
MAX_SEQ = 2**27


class ModelSpec(BaseModel):
    """One transformer architecture; sizes in elements, counts in layers/heads.

    Strict types (a size is an integer, not a string, float or bool; a flag is a bool), and
    the sizes fit together: heads divide the width, kv heads divide the heads, top-k <= experts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: str
    architecture: Architecture
    num_layers: int = Field(gt=0, description="decoder (or encoder-only) layers")
    num_encoder_layers: int = Field(default=0, ge=0, description="encoder layers (switch only)")
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0, description="per expert for MoE models")
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(default=0, ge=0, description="0 = num_heads (no GQA)")
    head_dim: int = Field(default=0, ge=0, description="0 = hidden_size / num_heads")
    vocab_size: int = Field(gt=0)
    embed_dim: int = Field(
        default=0,
        ge=0,
        description="token table and output head width, projected to and from the hidden size "
        "when it differs (OPT's word_embed_proj_dim, opt only); 0 = hidden_size",
    )
    max_positions: int = Field(default=2048, gt=0)
    activation: Activation = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rotary", "relative"] = "learned"
    bias: bool = True
    tied_embeddings: bool = True
    num_experts: int = Field(default=1, gt=0)
    experts_per_token: int = Field(default=1, gt=0)
    local_experts: int = Field(
        default=0,
        ge=0,
        description="experts one expert-parallel shard holds (the simulator sets it: "
        "num_experts / ep); 0 = num_experts",
    )
    moe_every: int = Field(default=1, gt=0, description="every n-th layer is MoE")
    expert_capacity: int = Field(
        default=0, ge=0, description="max tokens per expert and sequence; 0 = no cap"
    )

    @model_validator(mode="after")
    def _sizes_fit(self) -> ModelSpec:
        check_shapes(self)
        return self

    @property
    def kv_heads(self) -> int:
        """Key/value heads (grouped-query attention when below num_heads)."""
        return self.num_kv_heads or self.num_heads

    @property
    def causal(self) -> bool:
        """Whether self-attention is causal: every decoder stack (GPT-2, OPT, Llama, Mixtral);
        BERT's encoder attends both ways. One place, so that the kernels run, their memory
        and the causal MFU agree."""
        return self.architecture != "bert"

    @property
    def embed_width(self) -> int:
        """Width of the token table and the output head."""
        return self.embed_dim or self.hidden_size

    @property
    def dhead(self) -> int:
        """Elements per attention head."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def total_layers(self) -> int:
        """Encoder plus decoder layers."""
        return self.num_layers + self.num_encoder_layers

    def moe_layers(self, layers: int) -> int:
        """How many of ``layers`` layers carry experts."""
        return layers // self.moe_every if self.num_experts > 1 else 0

    def layer_params(self, *, moe: bool, cross_attention: bool = False) -> int:
        """Parameters of one transformer layer."""
        h, qd, kvd = self.hidden_size, self.num_heads * self.dhead, self.kv_heads * self.dhead
        b = 1 if self.bias else 0
        attn = h * (qd + 2 * kvd) + qd * h + b * (qd + 2 * kvd + h)
        mats = 3 if self.activation == "swiglu" else 2
        ffn = mats * h * self.ffn_hidden_size + b * (self.ffn_hidden_size + h)
        if moe:
            ffn = ffn * self.num_experts + h * self.num_experts  # experts + router
        norm = (2 if self.norm == "layernorm" else 1) * h
        norms = (3 if cross_attention else 2) * norm
        return attn * (2 if cross_attention else 1) + ffn + norms

    def layer_param_tensors(
        self, *, moe: bool, tp: int = 1, ep: int = 1, experts: bool = True
    ) -> list[int]:
        """Elements of each parameter tensor of one dense (or MoE) decoder layer on one GPU of a
        ``tp`` x ``ep`` split: the unit a per-tensor ZeRO-3 gather moves. Megatron's split: the
        column-parallel weights and biases and the row-parallel weights are divided by ``tp``;
        row-parallel biases and norms are replicated. Sums to `layer_params` at ``tp = ep = 1``.
        ``experts=False``: a MoE layer's tensors but its experts' (`expert_param_tensors`),
        which shard over their own expert-data-parallel group."""
        h, qd, kvd = self.hidden_size, self.num_heads * self.dhead, self.kv_heads * self.dhead
        norm = [h, h] if self.norm == "layernorm" else [h]
        attn = [h * (qd + 2 * kvd) // tp, qd * h // tp] + (
            [(qd + 2 * kvd) // tp, h] if self.bias else []
        )
        if not moe:
            return norm + attn + norm + self._mlp_tensors(tp)
        local = self.expert_param_tensors(tp=tp, ep=ep) if experts else []
        return norm + attn + norm + local + [h * self.num_experts]  # the router's, whole

    def expert_param_tensors(self, *, tp: int = 1, ep: int = 1) -> list[int]:
        """Elements of each expert parameter tensor one GPU holds of a MoE layer: its
        ``num_experts / ep`` experts' MLP tensors, split over ``tp`` as a dense MLP's."""
        local = max(1, self.num_experts // ep)
        return [t for t in self._mlp_tensors(tp) for _ in range(local)]

    def _mlp_tensors(self, tp: int) -> list[int]:
        h, f = self.hidden_size, self.ffn_hidden_size
        mats = 3 if self.activation == "swiglu" else 2
        return [h * f // tp] * mats + ([f // tp, h] if self.bias else [])

    def check_sequence(self, seq: int) -> None:
        """A `ConfigError` when ``seq`` tokens do not fit a learned position table (the model
        cannot run them: GPT-2, OPT and BERT index the table by position) or pass `MAX_SEQ`."""
        if seq > MAX_SEQ:
            raise ConfigError(
                f"seq {seq:,} tokens; at most {MAX_SEQ:,} (2^27) are modelled, give a shorter "
                "sequence"
            )
        if self.position == "learned" and seq > self.max_positions:
            raise ConfigError(
                f"seq {seq} exceeds model {self.id}'s {self.max_positions} learned positions; "
                f"give a sequence of at most {self.max_positions} tokens"
            )

    def num_params(self, *, embeddings: bool = True) -> int:
        """Total parameters; ``embeddings=False`` drops token/position tables and the head."""
        dec = self._stack_params(self.num_layers, cross=self.num_encoder_layers > 0)
        enc = self._stack_params(self.num_encoder_layers, cross=False)
        norm = (2 if self.norm == "layernorm" else 1) * self.hidden_size
        total = dec + enc + norm * (2 if self.num_encoder_layers else 1)
        if self.embed_width != self.hidden_size:  # OPT's project_in and project_out, no bias
            total += 2 * self.embed_width * self.hidden_size
        if embeddings:
            total += self.vocab_size * self.embed_width
            if self.position == "learned":
                total += self.max_positions * self.hidden_size
            if not self.tied_embeddings:
                total += self.vocab_size * self.embed_width
        return total

    def _stack_params(self, layers: int, *, cross: bool) -> int:
        moe = self.moe_layers(layers)
        dense = layers - moe
        return dense * self.layer_params(moe=False, cross_attention=cross) + moe * (
            self.layer_params(moe=True, cross_attention=cross)
        )


def list_models() -> list[str]:
    """Catalog ids, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.toml"))


def load_model(name_or_path: str | Path, *, data_dir: Path | None = None) -> ModelSpec:
    """A model by catalog id, TOML path, HF ``config.json`` path or NeuSight model name."""
    from simulator.hf_config import from_hf_config
    from simulator.model_files import model_from_toml, read_hf_json

    text = str(name_or_path)
    if (CATALOG_DIR / f"{text}.toml").is_file():
        return model_from_toml(CATALOG_DIR / f"{text}.toml")
    path = Path(text)
    if path.suffix == ".toml" and path.is_file():
        return model_from_toml(path)
    if path.suffix == ".json" and path.is_file():
        return from_hf_config(read_hf_json(path), path.stem, str(path))
    models_dir = (data_dir or DEFAULT_DATA_DIR) / "models"
    named = models_dir / f"{text}.json"
    if path.suffix == "" and named.is_file():
        return from_hf_config(read_hf_json(named), text, str(named))
    if path.suffix in {".toml", ".json"}:
        what = "is a folder; give the file" if path.is_dir() else "does not exist"
        raise ConfigError(f"model file {path} {what}")
    neusight = sorted(f.stem for f in models_dir.glob("*.json")) if models_dir.is_dir() else []
    near = [n for n in neusight if n.replace("_", "-").lower() == text.replace("_", "-").lower()]
    hint = f"did you mean {near[0]!r}? " if near else ""
    names = f" ({', '.join(neusight)})" if neusight else ""
    raise ConfigError(
        f"unknown model {text!r}: {hint}use a catalog id ({', '.join(list_models())}), a "
        f"NeuSight model name{names} from {models_dir}, or a path to a .toml or HF config .json"
    )
