"""Hugging Face ``config.json`` -> `ModelSpec`, one reader per ``model_type``.

Sizes must be JSON integers and flags JSON booleans (``"1280"`` and ``"false"`` are refused,
not coerced); `ModelSpec` then checks that the sizes fit together. Errors name the config's
own key (``n_embd``), not the `ModelSpec` field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from simulator.errors import ConfigError
from simulator.model_files import validate_model
from simulator.models import ModelSpec

Raw = dict[str, Any]

_REQUIRED: Any = object()


class _BadValueError(Exception):
    """A key of the wrong JSON type; `from_hf_config` adds the file."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


_LLAMA_KEYS = {
    "num_layers": "num_hidden_layers",
    "ffn_hidden_size": "intermediate_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "max_positions": "max_position_embeddings",
    "tied_embeddings": "tie_word_embeddings",
    "num_experts": "num_local_experts",
    "experts_per_token": "num_experts_per_tok",
}
# model_type -> {ModelSpec field: config key} where the names differ: the readers read each
# field through it (`_Config`), and error messages name the config's own key with it
KEYS: dict[str, dict[str, str]] = {
    "gpt2": {
        "num_layers": "n_layer",
        "hidden_size": "n_embd",
        "ffn_hidden_size": "n_inner",
        "num_heads": "n_head",
        "max_positions": "n_positions",
    },
    "opt": {
        "num_layers": "num_hidden_layers",
        "ffn_hidden_size": "ffn_dim",
        "num_heads": "num_attention_heads",
        "max_positions": "max_position_embeddings",
        "embed_dim": "word_embed_proj_dim",
    },
    "bert": {
        "num_layers": "num_hidden_layers",
        "ffn_hidden_size": "intermediate_size",
        "num_heads": "num_attention_heads",
        "max_positions": "max_position_embeddings",
    },
    "switch_transformers": {
        "num_layers": "num_decoder_layers",
        "num_encoder_layers": "num_layers",
        "hidden_size": "d_model",
        "ffn_hidden_size": "d_ff",
        "head_dim": "d_kv",
        "moe_every": "encoder_sparse_step",
    },
    "llama": _LLAMA_KEYS,
    "mixtral": _LLAMA_KEYS,
    "mistral": _LLAMA_KEYS,
    "qwen2": _LLAMA_KEYS,
}


class _Config:
    """One config's values read by `ModelSpec` field, through the model type's `KEYS`."""

    def __init__(self, raw: Raw, kind: str) -> None:
        self.raw, self.keys = raw, KEYS[kind]

    def int(
        self, field: str, default: Any = _REQUIRED, *, null_ok: bool = False, positive: bool = False
    ) -> Any:
        """The field's key, a JSON integer (not a bool, float or string); ``default`` when
        absent, or when ``null`` and ``null_ok`` (keys HF itself reads ``null`` as "the
        default" for). ``positive``: a value under 1 is refused by this key (an explicit 0
        is not "the default"; Hugging Face keeps it)."""
        key = self.keys.get(field, field)
        if key not in self.raw or (null_ok and self.raw[key] is None):
            if default is _REQUIRED:
                raise KeyError(key)
            return default
        value = self.raw[key]
        if type(value) is not int:
            raise _BadValueError(key, f"must be a JSON integer, got {json.dumps(value)}")
        if positive and value < 1:
            fix = "give at least 1" if default is _REQUIRED else "give at least 1 or leave it out"
            raise _BadValueError(key, f"must be at least 1, got {value}; {fix}")
        return value

    def flag(self, field: str, default: bool) -> bool:
        """The field's key, a JSON boolean (``"false"`` is a string, not false)."""
        key = self.keys.get(field, field)
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise _BadValueError(
                key, f"must be true or false (a JSON boolean), got {json.dumps(value)}"
            )
        return value


# HF ``activation_function`` (transformers' ACT2FN) -> how tilesim prices it: gelu_new as
# eager's eight element-wise kernels, the others as the one kernel each launches (silu at
# gelu's price, as `module_trace` prices it). Any other name was read as gelu without a word.
HF_ACTIVATIONS: dict[str, str] = {
    "gelu_new": "gelu_new",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "relu": "relu",
    "silu": "gelu",
    "swish": "gelu",
}


def _activation(raw: Raw, default: str) -> str:
    """``activation_function`` as tilesim prices it (`HF_ACTIVATIONS`), or the config class's
    default when absent (GPT2Config's is gelu_new, OPTConfig's relu)."""
    value = raw.get("activation_function", default)
    if not isinstance(value, str) or value not in HF_ACTIVATIONS:
        raise _BadValueError(
            "activation_function",
            f"is {json.dumps(value)}; tilesim prices {', '.join(HF_ACTIVATIONS)}",
        )
    return HF_ACTIVATIONS[value]


def _gpt2(raw: Raw) -> Raw:
    c = _Config(raw, "gpt2")
    h = c.int("hidden_size")
    return {
        "architecture": "gpt2",
        "num_layers": c.int("num_layers"),
        "hidden_size": h,
        "ffn_hidden_size": c.int("ffn_hidden_size", 4 * h, null_ok=True),
        "num_heads": c.int("num_heads"),
        "vocab_size": c.int("vocab_size"),
        "max_positions": c.int("max_positions", 1024),
        "activation": _activation(raw, "gelu_new"),
    }


def _opt(raw: Raw) -> Raw:
    c = _Config(raw, "opt")
    h = c.int("hidden_size")
    embed = c.int("embed_dim", h, null_ok=True)  # OPTConfig: null = hidden_size
    return {
        "architecture": "opt",
        "num_layers": c.int("num_layers"),
        "hidden_size": h,
        "embed_dim": 0 if embed == h else embed,
        "ffn_hidden_size": c.int("ffn_hidden_size"),
        "num_heads": c.int("num_heads"),
        "vocab_size": c.int("vocab_size"),
        "max_positions": c.int("max_positions", 2048) + 2,
        "activation": _activation(raw, "relu"),
    }


def _bert(raw: Raw) -> Raw:
    c = _Config(raw, "bert")
    return {
        "architecture": "bert",
        "num_layers": c.int("num_layers"),
        "hidden_size": c.int("hidden_size"),
        "ffn_hidden_size": c.int("ffn_hidden_size"),
        "num_heads": c.int("num_heads"),
        "vocab_size": c.int("vocab_size"),
        "max_positions": c.int("max_positions", 512),
        "activation": "gelu",
    }


def _switch(raw: Raw) -> Raw:
    c = _Config(raw, "switch_transformers")
    encoder_layers = c.int("num_encoder_layers", positive=True)
    decoder_layers = c.int("num_layers", None, null_ok=True, positive=True)
    return {
        "architecture": "switch",
        "num_layers": encoder_layers if decoder_layers is None else decoder_layers,
        "num_encoder_layers": encoder_layers,
        "hidden_size": c.int("hidden_size"),
        "ffn_hidden_size": c.int("ffn_hidden_size"),
        "num_heads": c.int("num_heads"),
        "head_dim": c.int("head_dim"),
        "vocab_size": c.int("vocab_size"),
        "activation": "relu",
        "norm": "rmsnorm",
        "position": "relative",
        "bias": False,
        "num_experts": c.int("num_experts"),
        "moe_every": c.int("moe_every", 2),
        "expert_capacity": c.int("expert_capacity", 0),
    }


def _llama(raw: Raw) -> Raw:
    c = _Config(raw, "llama")
    mixtral = raw.get("model_type") == "mixtral"  # MixtralConfig's defaults: 8 experts, top-2
    experts = c.int("num_experts", 8 if mixtral else 1)
    return {
        "architecture": "mixtral" if experts > 1 else "llama",
        "num_layers": c.int("num_layers"),
        "hidden_size": c.int("hidden_size"),
        "ffn_hidden_size": c.int("ffn_hidden_size"),
        "num_heads": c.int("num_heads"),
        "num_kv_heads": c.int("num_kv_heads", 0, null_ok=True, positive=True),
        "head_dim": c.int("head_dim", 0, null_ok=True, positive=True),
        "vocab_size": c.int("vocab_size"),
        "max_positions": c.int("max_positions", 4096),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "position": "rotary",
        "bias": False,
        "tied_embeddings": c.flag("tied_embeddings", False),
        "num_experts": experts,
        "experts_per_token": c.int("experts_per_token", 2 if mixtral else 1),
    }


READERS: dict[str, Callable[[Raw], Raw]] = {
    "gpt2": _gpt2,
    "opt": _opt,
    "bert": _bert,
    "switch_transformers": _switch,
    "llama": _llama,
    "mixtral": _llama,
    # Llama's layer: RMSNorm, rotary, SwiGLU, grouped-query attention. Mistral's sliding
    # window is not modelled (attention over the whole causal context, as HF eager computes
    # it under its mask); Qwen2's q/k/v biases sit in their GEMMs (addmm), which the linear
    # family prices with a bias either way
    "mistral": _llama,
    "qwen2": _llama,
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
    except _BadValueError as e:
        raise ConfigError(f"{source}: key {e.key!r} {e}") from e
    return validate_model({"id": model_id, **fields}, source, KEYS[kind])
