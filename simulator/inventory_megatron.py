"""Op inventory of a Megatron-LM-style fused implementation, shared by all decoder stacks.

Fused kernels and how they are modelled with the forecaster's families:

* fused layer norm / RMSNorm: one ``layernorm`` kernel (backward: the rule of `oprules`); an
  RMSNorm owns a weight and no bias;
* flash attention: no ``S x S`` tensor in DRAM; in fp16/bf16 one FlashAttention-2 kernel
  forward and one backward (``attention`` family), causal (``attention_causal``,
  ``attention_causal_bwd``: the blocks above the diagonal skipped, about half the work) in
  every decoder stack (GPT-2, OPT, Llama, Mixtral) and non-causal in BERT's encoder; with
  context parallelism the shard's sequence is ``S/cp``; this causal kernel is the ring's
  step 0 and `stagecost.ring_steps` adds TransformerEngine's ``cp - 1`` unmasked half steps
  (the causal pairs of the whole ``S x S`` matrix over ``cp``, exactly). fp8 training runs
  them in bf16, as TransformerEngine does by default (fp8 for the GEMMs only). Other dtypes
  (FlashAttention-2 has no fp32 kernels the forecaster models) keep the GEMM-shaped stand-in:
  forward the two attention GEMMs (QK^T, AV) as ``bmm`` kernels, backward five (recomputed
  QK^T, dV, dP, dQ, dK), non-causal; with ``Workload.attention = "unfused"``, Megatron's
  ``CoreAttention`` before FlashAttention instead (`unfused_attention`): ``baddbmm`` QK^T, the
  fused scale-mask-softmax kernel (16-bit; fp32 falls back to ``masked_fill`` + eager
  softmax), attention dropout, ``bmm`` AV and the head-merge copy, over ``b * a/t * s * s``
  scores; Megatron-LM runs it on GPUs without FlashAttention-2 kernels, below sm80
  (`opgraph.on_gpu`);
* fused bias-GeLU / SwiGLU: one element-wise kernel over the FFN activations;
* fused bias-dropout-add: one element-wise ``add``;
* fused Adam: see `opgraph.optimizer_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from forecast.kernels import FAMILY_OPS, ITEMSIZE_BYTES, Dtype, KernelSpec, OpFamily
from simulator import oprules as r
from simulator.inventory_hf import Sizes, attention_core, sizes
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp

ATTN = OpFamily.ATTENTION
FLASH_KERNEL_DTYPES = frozenset({Dtype.FP16, Dtype.BF16})  # `tensor_core.ATTENTION_DTYPES`


def flash_attention(z: Sizes, *, causal: bool = True) -> FrameworkOp:
    """FlashAttention-2 forward and backward: its own kernels in fp16/bf16, and in bf16 for
    fp8 training (causal for a decoder), else GEMM-shaped stand-ins (module docstring)."""
    bh = z.B * z.nh
    # fp8 training runs its attention in bf16 (TransformerEngine's default: fp8 GEMMs only)
    dt = Dtype.BF16 if z.dt is Dtype.FP8 else z.dt
    if dt in FLASH_KERNEL_DTYPES:
        if z.cache and z.S == 1:  # decoding: FA2 lays a GQA group out as query rows, no mask
            dims = (z.B * z.kv, z.nh // z.kv, z.keys, z.d)
            return FrameworkOp("flash_attention", (KernelSpec(ATTN, dims, dt, "attention"),))
        fw, bw = ("attention_causal", "attention_causal_bwd") if causal else FAMILY_OPS[ATTN][:2]
        dims = (bh, z.S, z.keys, z.d)
        fw_k, bw_k = KernelSpec(ATTN, dims, dt, fw), KernelSpec(ATTN, dims, dt, bw)
        return FrameworkOp("flash_attention", (fw_k,), (bw_k,))
    qk = KernelSpec(OpFamily.BMM, (bh, z.S, z.d, z.keys), z.dt)
    av = KernelSpec(OpFamily.BMM, (bh, z.S, z.keys, z.d), z.dt)
    grad_k = KernelSpec(OpFamily.BMM, (bh, z.S, z.S, z.d), z.dt)
    return FrameworkOp("flash_attention", (qk, av), (qk, av, av, grad_k, grad_k))


def unfused_attention(z: Sizes) -> list[FrameworkOp]:
    """Megatron's ``CoreAttention`` without FlashAttention: in fp32 the torch fallback, the
    eager ops of `inventory_hf.attention_core` (mask then softmax, the scale folded into the
    QK^T GEMM); in 16 bits one fused scale-mask-softmax kernel in their place."""
    ops = attention_core(z, mask_op="where", scale=False)
    if ITEMSIZE_BYTES[z.dt] <= 2:  # fused scale-mask-softmax: y, dy -> dx in one kernel
        rows, cols = z.scores
        fused = FrameworkOp(
            "softmax",
            (KernelSpec(OpFamily.SOFTMAX, (rows, cols), z.dt),),
            (KernelSpec(OpFamily.SOFTMAX, (rows * 3 // 2, cols), z.dt),),
        )
        ops[1:3] = [fused]  # mask, softmax
    return ops


def _norm(name: str, m: ModelSpec, z: Sizes) -> FrameworkOp:
    """Fused layer norm (weight and bias) or RMSNorm (weight only)."""
    op = r.layernorm(name, z.T, z.H, z.dt)
    return replace(op, params=op.params[:1]) if m.norm == "rmsnorm" else op


def _ffn(m: ModelSpec, z: Sizes, rows: int) -> list[FrameworkOp]:
    bias = m.bias
    if m.activation == "swiglu":
        return [
            r.linear("fc_gate_up", rows, (z.H, 2 * z.F), z.dt, bias=bias),
            r.elementwise("swiglu", "mul", (rows, z.F), z.dt),
            r.linear("fc_down", rows, (z.F, z.H), z.dt, bias=bias),
        ]
    act = "relu" if m.activation == "relu" else "gelu"
    return [
        r.linear("fc1", rows, (z.H, z.F), z.dt, bias=bias),
        r.elementwise(f"bias_{act}", act, (rows, z.F), z.dt),
        r.linear("fc2", rows, (z.F, z.H), z.dt, bias=bias),
    ]


def decoder(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """Embedding, ``num_layers`` fused layers, final norm and output head."""
    z = sizes(m, run)
    qkv = (z.nh + 2 * z.kv) * z.d
    ffn = _ffn(m, z, z.T)
    if m.num_experts > 1:
        # Megatron-core caps each expert at ceil(f * local tokens * k / E) (router's
        # topk_softmax_with_capacity, capacity_factor f): proportional to a micro-batch's
        # tokens, i.e. a per-sequence cap (`ModelSpec.expert_capacity` = f s k / E) once per
        # sequence of the micro-batch; under cp `stagecost.shard_model` scales it to s / cp
        rows = m.expert_rows(z.T, z.B)
        ffn = [
            r.linear("router", z.T, (z.H, m.num_experts), z.dt, bias=False),
            r.memory("permute", "copy", (z.T * m.experts_per_token, z.H), z.dt, bw_op="copy"),
            *(_ffn(m, z, rows) * m.routed_experts(z.T)),
            r.memory("unpermute", "copy", (z.T * m.experts_per_token, z.H), z.dt, bw_op="copy"),
        ]
    kv_shape = (z.T, 2 * z.kv * z.d)  # in the dtype attention reads it in (bf16 for fp8)
    causal = m.architecture != "bert"  # BERT's encoder attends both ways
    flash = [flash_attention(z, causal=causal)]
    attention = flash if run.attention == "flash" else unfused_attention(z)
    layer = [
        _norm("input_norm", m, z),
        r.linear("qkv", z.T, (z.H, qkv), z.dt, bias=m.bias),
        # a static KV cache (Megatron's inference): the pass's K and V written into it
        *([r.memory("kv_cache_write", "copy", kv_shape, run.kv_dtype)] if z.cache else []),
        *attention,
        r.linear("proj", z.T, (z.nh * z.d, z.H), z.dt, bias=m.bias),
        r.elementwise("bias_dropout_add", "add", (z.T, z.H), z.dt),
        _norm("post_norm", m, z),
        *ffn,
        r.elementwise("bias_dropout_add_2", "add", (z.T, z.H), z.dt),
    ]
    e = m.embed_width  # OPT's word_embed_proj_dim: projected to and from the hidden size
    embed = [r.embedding("tokens", z.T, (z.V, e), z.dt)]
    head = [_norm("final_norm", m, z)]
    if e != z.H:
        embed.append(r.linear("project_in", z.T, (e, z.H), z.dt, bias=False))
        head.append(r.linear("project_out", z.T, (z.H, e), z.dt, bias=False))
    if m.position == "learned":  # GPT/BERT/OPT: word + position embeddings (rotary: none)
        embed += [
            r.embedding("positions", z.S, (m.max_positions, z.H), z.dt),
            r.elementwise("add_positions", "add", (z.T, z.H), z.dt),
        ]
    output = r.linear("output", z.logit_rows, (e, z.V), z.dt, bias=False)
    head.append(r.tie(output, m.tied_embeddings))
    return (
        Block("embed", tuple(embed)),
        Block("layer", tuple(layer), m.num_layers),
        Block("head", tuple(head)),
    )


MEGATRON_INVENTORIES: dict[str, Callable[[ModelSpec, Workload], tuple[Block, ...]]] = {
    "gpt2": decoder,
    "opt": decoder,
    "bert": decoder,
    "llama": decoder,
    "mixtral": decoder,
}
