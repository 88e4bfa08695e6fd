"""Parameters one GPU of a TP x EP x PP layout holds: per layer (dense, MoE, its experts),
per chunk of layers, and the tables beyond the layers (embedding, positions, head).

Megatron-LM's split: column- and row-parallel weights and the column-parallel biases over
``tp``, the norms and the row-parallel biases whole on every TP rank, a MoE layer's router
whole and its ``num_experts / ep`` experts a ``1 / tp`` shard each; vocabulary-parallel
embedding and head.
"""

from __future__ import annotations

from simulator.memory import gemm_weights
from simulator.models import ModelSpec
from simulator.parallel import RunConfig


def expert_params(model: ModelSpec) -> int:
    """Parameters of one expert's MLP (as `ModelSpec.layer_params` counts a layer's MLP)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    mats = 3 if model.activation == "swiglu" else 2
    return mats * h * f + (f + h if model.bias else 0)


def expert_layer_params(model: ModelSpec, run: RunConfig) -> float:
    """Expert parameters one GPU holds of one MoE layer: its ``num_experts / ep`` experts, a
    ``1 / tp`` shard of each. The layer's other parameters are held as a dense layer's are,
    the router whole (`moe_layer_params`)."""
    return model.num_experts * expert_params(model) / (run.tp * run.ep)


def chunk_expert_params(model: ModelSpec, run: RunConfig, layers: int) -> float:
    """Expert parameters one GPU holds for a chunk of ``layers`` layers."""
    return model.moe_layers(layers) * expert_layer_params(model, run)


def replicated_layer_params(model: ModelSpec, *, moe: bool) -> int:
    """Parameters of one layer every TP rank holds whole: the norms' weights (and LayerNorm's
    biases) and the row-parallel linears' biases (Megatron's RowParallelLinear adds its bias
    after the reduction, unsplit; `ModelSpec.layer_param_tensors`): the projection's, and in
    a dense layer fc2's."""
    h = model.hidden_size
    norms = 2 * (2 if model.norm == "layernorm" else 1) * h
    return norms + ((1 if moe else 2) * h if model.bias else 0)


def dense_layer_params(model: ModelSpec, run: RunConfig) -> float:
    """Parameters one GPU holds of one dense layer: the column-parallel weights and biases and
    the row-parallel weights over ``tp``, the norms and row-parallel biases whole (it divided
    the whole layer by ``tp``)."""
    whole = replicated_layer_params(model, moe=False)
    return (model.layer_params(moe=False) - whole) / run.tp + whole


def moe_layer_params(model: ModelSpec, run: RunConfig) -> float:
    """Parameters one GPU holds of one MoE layer: the shared part (attention, norms) as a dense
    layer holds it, the router's ``h x E`` weight whole (Megatron-core's TopKRouter does not
    split it over TP; its gradient is all-reduced over TP, as `ModelSpec.layer_param_tensors`
    lists it), its experts."""
    router = model.hidden_size * model.num_experts
    shared = model.layer_params(moe=True) - model.num_experts * expert_params(model) - router
    whole = replicated_layer_params(model, moe=True)
    return (shared - whole) / run.tp + whole + router + expert_layer_params(model, run)


def chunk_gemm_weights(model: ModelSpec, run: RunConfig, layers: int) -> tuple[float, float]:
    """Elements of the GEMM weights (QKV, projection, the MLP's; not the router, norms, biases
    or the tables) one GPU holds for a chunk of ``layers`` layers, and how many of them are
    expert weights: what TransformerEngine casts to fp8 (`dist_memory`; `memory.gemm_weights`)."""
    return gemm_weights(model, layers, tp=run.tp, ep=run.ep)


def chunk_params(model: ModelSpec, run: RunConfig, layers: int, *, first: bool, last: bool) -> int:
    """Parameters one GPU holds for a model chunk: its layers, plus embedding or head."""
    moe = model.moe_layers(layers)
    total = (layers - moe) * dense_layer_params(model, run)
    total += moe * moe_layer_params(model, run) if moe else 0.0
    return int(total + sum(end_tensors(model, run, first=first, last=last)))


def end_tensors(model: ModelSpec, run: RunConfig, *, first: bool, last: bool) -> list[float]:
    """Elements of the tables one GPU holds beyond a chunk's layers: the vocabulary-parallel
    embedding and learned positions on the first chunk, the final norm and the head on the last
    (the head unless it is the tied embedding of the same GPU); a table narrower or wider than
    the layers (OPT's word_embed_proj_dim) brings its projection in (first) or out (last),
    each whole."""
    e, h = model.embed_width, model.hidden_size
    table = model.vocab_size * e / run.tp
    project = [float(e * h)] if e != h else []
    out: list[float] = []
    if first:
        out += [table, *project]
        if model.position == "learned":
            out.append(float(model.max_positions * h))
    if last:  # the final norm (replicated over tp), the projection out, the head
        out += [float(h)] * (2 if model.norm == "layernorm" else 1) + project
        if run.pp > 1 or not model.tied_embeddings:
            out.append(table)
    return out
