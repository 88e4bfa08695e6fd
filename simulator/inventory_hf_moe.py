"""HF eager inventories of the RMSNorm families: Llama/Mixtral (RoPE, GQA, SwiGLU, top-k MoE)
and Switch Transformer (T5 encoder-decoder, every ``moe_every``-th FFN a top-1 MoE).

Llama is not checked against a per-op trace (the NeuSight labels have none); Switch against
its one full-model trace on L4 (T5 attention has no score scaling; the position bias is a
full-size add). Expert FFNs see ``tokens * experts_per_token / num_experts`` tokens
each (balanced routing), at most ``expert_capacity`` per sequence (HF Switch drops the rest);
with few routed rows (decoding) only the experts they are expected to reach run
(`moe_routing.expert_groups`).
"""

from __future__ import annotations

from collections.abc import Callable

from forecast.kernels import Dtype
from simulator import oprules as r
from simulator.inventory_hf import Sizes, attention_core, cache_append, sizes
from simulator.models import ModelSpec
from simulator.moe_routing import expert_groups
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp


def rmsnorm(name: str, rows: int, h: int, dt: Dtype) -> list[FrameworkOp]:
    """HF eager RMSNorm: pow, mean (a read), x * rsqrt, weight * x: four kernels."""
    norm = r.elementwise(f"{name}_scale", "mul", (rows, h), dt)
    weighted = r.elementwise(f"{name}_weight", "mul", (rows, h), dt)
    weighted = r.FrameworkOp(weighted.name, weighted.fw, weighted.bw, ((1, h),))
    return [
        r.elementwise(f"{name}_pow", "powu", (rows, h), dt),
        r.memory(f"{name}_mean", "copy", (rows // 2, h), dt),
        norm,
        weighted,
    ]


def rope(name: str, rows: int, width: int, dt: Dtype) -> list[FrameworkOp]:
    """Rotary embedding in eager PyTorch: x*cos, rotate_half (neg + cat), *sin, add."""
    shape = (rows, width)
    return [
        r.elementwise(f"{name}_cos", "mul", shape, dt),
        r.elementwise(f"{name}_neg", "mulu", (rows, width // 2), dt),
        r.memory(f"{name}_cat", "copy", shape, dt, bw_op="copy"),
        r.elementwise(f"{name}_sin", "mul", shape, dt),
        r.elementwise(f"{name}_add", "add", shape, dt),
    ]


def swiglu_ffn(name: str, rows: int, z: Sizes) -> list[FrameworkOp]:
    """gate/up projections, SiLU (a transcendental unary: modelled as ``gelu``), product, down."""
    return [
        r.linear(f"{name}_gate", rows, (z.H, z.F), z.dt, bias=False),
        r.linear(f"{name}_up", rows, (z.H, z.F), z.dt, bias=False),
        r.elementwise(f"{name}_silu", "gelu", (rows, z.F), z.dt),
        r.elementwise(f"{name}_mul", "mul", (rows, z.F), z.dt),
        r.linear(f"{name}_down", rows, (z.F, z.H), z.dt, bias=False),
    ]


def moe_ffn(
    m: ModelSpec, z: Sizes, expert: Callable[[int], list[FrameworkOp]]
) -> list[FrameworkOp]:
    """Router, then per expert hit: gather, the expert FFN ``expert(rows)``, weighted
    scatter-add (`moe_routing.expert_groups`: an EP shard's own experts, those a row reaches)."""
    router = [
        r.linear("router", z.T, (z.H, m.num_experts), z.dt, bias=False),
        r.softmax("router_softmax", z.T, m.num_experts, z.dt),
    ]
    per_expert = [
        op
        for rows, n in expert_groups(m, z.T, z.B)
        for op in [
            r.memory("gather", "copy", (rows, z.H), z.dt, bw_op="embedding"),
            *expert(rows),
            r.elementwise("route_weight", "mulu", (rows, z.H), z.dt),
            r.memory("scatter", "embedding", (rows, z.H), z.dt, bw_op="copy"),
        ]
        * n
    ]
    return router + per_expert


def llama(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """LlamaForCausalLM / MixtralForCausalLM in eager attention."""
    z = sizes(m, run)
    qd, kvd = z.nh * z.d, z.kv * z.d
    ffn: list[FrameworkOp] = swiglu_ffn("mlp", z.T, z)
    if m.num_experts > 1:
        ffn = moe_ffn(m, z, lambda rows: swiglu_ffn("expert", rows, z))
    repeat_kv = [r.memory(f"repeat_{x}", "copy", (z.B * z.keys, qd), z.dt) for x in "kv"]
    layer = [
        *rmsnorm("input_norm", z.T, z.H, z.dt),
        r.linear("q_proj", z.T, (z.H, qd), z.dt, bias=False),
        r.linear("k_proj", z.T, (z.H, kvd), z.dt, bias=False),
        r.linear("v_proj", z.T, (z.H, kvd), z.dt, bias=False),
        *rope("rope_q", z.T, qd, z.dt),
        *rope("rope_k", z.T, kvd, z.dt),
        *cache_append(z, kvd),
        *(repeat_kv if z.kv < z.nh else []),
        *attention_core(z, mask_op="add_row", copied="" if z.kv < z.nh else "v"),
        r.linear("o_proj", z.T, (qd, z.H), z.dt, bias=False),
        r.elementwise("attn_add", "add", (z.T, z.H), z.dt),
        *rmsnorm("post_norm", z.T, z.H, z.dt),
        *ffn,
        r.elementwise("mlp_add", "add", (z.T, z.H), z.dt),
    ]
    embed = [r.embedding("tokens", z.T, (z.V, z.H), z.dt)]
    head = [
        *rmsnorm("norm", z.T, z.H, z.dt),
        r.tie(r.linear("lm_head", z.logit_rows, (z.H, z.V), z.dt, bias=False), m.tied_embeddings),
    ]
    return (
        Block("embed", tuple(embed), host_ops=10),
        Block("layer", tuple(layer), m.num_layers, host_ops=60),
        Block("head", tuple(head), host_ops=2),
    )


def _t5_attention(z: Sizes, tag: str) -> list[FrameworkOp]:
    hd = z.nh * z.d
    return [
        *rmsnorm(f"{tag}_norm", z.T, z.H, z.dt),
        *(r.linear(f"{tag}_{x}", z.T, (z.H, hd), z.dt, bias=False) for x in "qkv"),
        *attention_core(z, mask_op="add", scale=False, copied="qkv"),
        r.linear(f"{tag}_o", z.T, (hd, z.H), z.dt, bias=False),
        r.dropout(f"{tag}_dropout", z.T, z.H, z.dt),
        r.elementwise(f"{tag}_add", "add", (z.T, z.H), z.dt),
    ]


def _t5_dense(z: Sizes, rows: int) -> list[FrameworkOp]:
    return [
        r.linear("wi", rows, (z.H, z.F), z.dt, bias=False),
        r.elementwise("relu", "relu", (rows, z.F), z.dt),
        r.dropout("ffn_dropout", rows, z.F, z.dt),
        r.linear("wo", rows, (z.F, z.H), z.dt, bias=False),
    ]


def _t5_ffn(m: ModelSpec, z: Sizes, *, moe: bool) -> list[FrameworkOp]:
    body = moe_ffn(m, z, lambda rows: _t5_dense(z, rows)) if moe else _t5_dense(z, z.T)
    norm = rmsnorm("ffn_norm", z.T, z.H, z.dt)
    return [
        *norm,
        *body,
        r.dropout("out_dropout", z.T, z.H, z.dt),
        r.elementwise("ffn_add", "add", (z.T, z.H), z.dt),
    ]


def switch(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """SwitchTransformersForConditionalGeneration; decoder length = encoder length."""
    z = sizes(m, run)
    enc_moe = m.moe_layers(m.num_encoder_layers)
    dec_moe = m.moe_layers(m.num_layers)
    enc_attn = _t5_attention(z, "self")
    dec_attn = _t5_attention(z, "self") + _t5_attention(z, "cross")
    blocks = [
        Block("embed", (r.embedding("tokens", 2 * z.T, (z.V, z.H), z.dt),), host_ops=20),
        Block(
            "enc_dense",
            tuple(enc_attn + _t5_ffn(m, z, moe=False)),
            m.num_encoder_layers - enc_moe,
            60,
        ),
        Block("enc_moe", tuple(enc_attn + _t5_ffn(m, z, moe=True)), enc_moe, 120),
        Block("dec_dense", tuple(dec_attn + _t5_ffn(m, z, moe=False)), m.num_layers - dec_moe, 90),
        Block("dec_moe", tuple(dec_attn + _t5_ffn(m, z, moe=True)), dec_moe, 150),
        Block(
            "head",
            (
                *rmsnorm("final_norm", 2 * z.T, z.H, z.dt),
                r.tie(r.linear("lm_head", z.T, (z.H, z.V), z.dt, bias=False), m.tied_embeddings),
            ),
            host_ops=4,
        ),
    ]
    return tuple(b for b in blocks if b.repeat > 0)
