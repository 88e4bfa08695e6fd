"""Hugging Face ``config.json`` -> `ModelSpec`, one reader per ``model_type``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.errors import ConfigError
from simulator.models import ModelSpec, _validate

Raw = dict[str, Any]


def _gpt2(raw: Raw) -> Raw:
    h = raw["n_embd"]
    return {
        "architecture": "gpt2",
        "num_layers": raw["n_layer"],
        "hidden_size": h,
        "ffn_hidden_size": raw.get("n_inner") or 4 * h,
        "num_heads": raw["n_head"],
        "vocab_size": raw["vocab_size"],
        "max_positions": raw.get("n_positions", 1024),
        "activation": "gelu_new" if raw.get("activation_function") == "gelu_new" else "gelu",
    }


def _opt(raw: Raw) -> Raw:
    return {
        "architecture": "opt",
        "num_layers": raw["num_hidden_layers"],
        "hidden_size": raw["hidden_size"],
        "ffn_hidden_size": raw["ffn_dim"],
        "num_heads": raw["num_attention_heads"],
        "vocab_size": raw["vocab_size"],
        "max_positions": raw.get("max_position_embeddings", 2048) + 2,
        "activation": "relu" if raw.get("activation_function") == "relu" else "gelu",
    }


def _bert(raw: Raw) -> Raw:
    return {
        "architecture": "bert",
        "num_layers": raw["num_hidden_layers"],
        "hidden_size": raw["hidden_size"],
        "ffn_hidden_size": raw["intermediate_size"],
        "num_heads": raw["num_attention_heads"],
        "vocab_size": raw["vocab_size"],
        "max_positions": raw.get("max_position_embeddings", 512),
        "activation": "gelu",
    }


def _switch(raw: Raw) -> Raw:
    return {
        "architecture": "switch",
        "num_layers": raw.get("num_decoder_layers") or raw["num_layers"],
        "num_encoder_layers": raw["num_layers"],
        "hidden_size": raw["d_model"],
        "ffn_hidden_size": raw["d_ff"],
        "num_heads": raw["num_heads"],
        "head_dim": raw["d_kv"],
        "vocab_size": raw["vocab_size"],
        "activation": "relu",
        "norm": "rmsnorm",
        "position": "relative",
        "bias": False,
        "num_experts": raw["num_experts"],
        "moe_every": raw.get("encoder_sparse_step", 2),
        "expert_capacity": raw.get("expert_capacity", 0),
    }


def _llama(raw: Raw) -> Raw:
    experts = raw.get("num_local_experts", 1)
    return {
        "architecture": "mixtral" if experts > 1 else "llama",
        "num_layers": raw["num_hidden_layers"],
        "hidden_size": raw["hidden_size"],
        "ffn_hidden_size": raw["intermediate_size"],
        "num_heads": raw["num_attention_heads"],
        "num_kv_heads": raw.get("num_key_value_heads", 0),
        "vocab_size": raw["vocab_size"],
        "max_positions": raw.get("max_position_embeddings", 4096),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "position": "rotary",
        "bias": False,
        "tied_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "num_experts": experts,
        "experts_per_token": raw.get("num_experts_per_tok", 1),
    }


READERS: dict[str, Callable[[Raw], Raw]] = {
    "gpt2": _gpt2,
    "opt": _opt,
    "bert": _bert,
    "switch_transformers": _switch,
    "llama": _llama,
    "mixtral": _llama,
}


def from_hf_config(raw: Raw, model_id: str, source: str) -> ModelSpec:
    """Read one HF config; unknown ``model_type`` values name the supported ones."""
    kind = str(raw.get("model_type", ""))
    if kind not in READERS:
        raise ConfigError(
            f"{source}: unsupported model_type {kind!r}; supported: {', '.join(READERS)}"
        )
    try:
        fields = READERS[kind](raw)
    except KeyError as e:
        raise ConfigError(f"{source}: {kind} config lacks key {e}") from e
    return _validate({"id": model_id, **fields}, source)
