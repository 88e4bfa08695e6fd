"""Op inventory of a Megatron-LM-style fused implementation, shared by all decoder stacks.

Fused kernels and how they are modelled with the forecaster's families:

* fused layer norm / RMSNorm: one ``layernorm`` kernel (backward: the rule of `oprules`); an
  RMSNorm owns a weight and no bias;
* flash attention: no ``S x S`` tensor in DRAM; in fp16/bf16 one FlashAttention-2 kernel
  forward and one backward (``attention`` family), causal (``attention_causal``,
  ``attention_causal_bwd``: the blocks above the diagonal skipped, about half the work) in
  every decoder stack (GPT-2, OPT, Llama, Mixtral) and non-causal in BERT's encoder; with
  context parallelism the shard's sequence is ``S/cp``; this causal kernel is the p2p ring's
  step 0 and `context_parallel.ring_steps` adds TransformerEngine's ``cp - 1`` unmasked half steps
  (the causal pairs of the whole ``S x S`` matrix over ``cp``, exactly; ``all_gather`` and
  ``a2a`` reshape it into their own kernels: `context_parallel.schedule_core`). fp8 training runs
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

fp8 training (`opgraph.te_fp8`: Megatron-LM with TransformerEngine) runs in fp8 only the GEMMs of
TE's linear modules, the layer's QKV, projection and MLP linears (`te_linear`); every other op
(norms, activation functions, residual adds, embedding, attention, the MoE router, the output
layer) is the bf16 inventory's (`activation_dtype`). The router is Megatron-core's
``TopKRouter``, a plain ``torch.nn.functional.linear`` on the bf16 hidden states; the output
layer a plain ``tensor_parallel.ColumnParallelLinear``; OPT's ``project_in`` / ``project_out``
have no Megatron counterpart and sit with the embedding and the head, outside TE's layer: all
bf16 GEMMs. TE's own fp8 casts (`fp8_cast`) are memory-bound kernels next to each fp8 GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from forecast.kernels import ITEMSIZE_BYTES, Dtype, KernelSpec, OpFamily
from simulator import oprules as r
from simulator.inventory_hf import Sizes, attention_core, sizes
from simulator.models import ModelSpec
from simulator.moe_routing import expert_groups, routed_rows
from simulator.opgraph import Block, Workload, te_fp8
from simulator.oprules import FrameworkOp

ATTN = OpFamily.ATTENTION
FLASH_KERNEL_DTYPES = frozenset({Dtype.FP16, Dtype.BF16})  # `tensor_core.ATTENTION_DTYPES`


def activation_dtype(dtype: Dtype) -> Dtype:
    """Element type of every op but TE's linear GEMMs: bf16 under fp8 training (`opgraph.te_fp8`:
    TransformerEngine returns bf16 from its fp8 GEMMs), else ``dtype``."""
    return Dtype.BF16 if te_fp8(dtype, "megatron") else dtype


# TransformerEngine's fp8 casts of a GEMM operand of ``rows x width`` bf16 elements, in bytes
# moved per element: ``cast`` reads 2 and writes 1 (``cast_to_fp8``), ``cast_transpose`` writes
# the fp8 copy and its transpose (``fp8_cast_transpose_fused``, ``..._bgrad_fused``: a bias
# gradient's column sum rides along), ``transpose`` reads and writes fp8 (``fp8_transpose``).
CAST_BYTES_PER_ELEMENT: dict[str, int] = {"cast": 3, "cast_transpose": 4, "transpose": 2}


def fp8_cast(kind: str, rows: int, width: int) -> KernelSpec:
    """One TE cast kernel (`CAST_BYTES_PER_ELEMENT`) as the forecaster's memory family prices
    it: a bf16 ``copy`` (4 bytes an element) over ``width x bytes / 4`` columns, so that its
    bytes are the cast's, ``rows x width x bytes``."""
    cols = -(-width * CAST_BYTES_PER_ELEMENT[kind] // 4)
    return KernelSpec(OpFamily.MEMORY, (max(1, rows), max(1, cols)), Dtype.BF16, "copy")


def te_linear(
    name: str,
    rows: int,
    dims: tuple[int, int],
    dtype: Dtype,
    *,
    bias: bool,
    fused_norm: bool = False,
    train: bool = True,
) -> FrameworkOp:
    """A linear of TE's layer (``rows`` tokens, ``dims = (n_in, n_out)``): `oprules.linear` in
    the workload's dtype, and under fp8 (`opgraph.te_fp8`) its three GEMMs in fp8 plus TE's
    casts (`_te_casts`). The GEMMs come first in ``fw`` and ``bw`` (dgrad, wgrad: `stagecost`
    reads them there). The weights' casts run once a step (``is_first_microbatch``), not per
    pass: not listed here."""
    if not te_fp8(dtype, "megatron"):
        return r.linear(name, rows, dims, dtype, bias=bias)
    gemms = r.linear(name, rows, dims, Dtype.FP8, bias=bias)
    fw, bw = _te_casts(rows, dims, fused_norm=fused_norm, train=train)
    return replace(gemms, fw=(*gemms.fw, *fw), bw=(*gemms.bw[:2], *bw))


def _te_casts(
    rows: int, dims: tuple[int, int], *, fused_norm: bool, train: bool
) -> tuple[tuple[KernelSpec, ...], tuple[KernelSpec, ...]]:
    """The forward and backward fp8 casts of one TE linear (TE 1.x,
    transformer_engine/pytorch/module/linear.py ``_Linear``, layernorm_linear.py
    ``_LayerNormLinear``, base.py ``grad_output_preprocess``):

    * forward: ``Linear`` (the projection, fc2, the experts' GroupedLinear) casts its bf16
      input, with its transpose for the weight gradient when training (``cast_transpose``,
      else ``cast``); ``LayerNormLinear`` (``fused_norm``: QKV, a dense layer's fc1; Megatron
      core's TELayerNormColumnParallelLinear) none, its norm kernel writes fp8 directly (that
      norm stays priced as the bf16 one, one byte an element over: a kernel has one dtype,
      and a rows-scaled stand-in would escape `sequence_parallel`'s row split);
    * backward: the output gradient's ``cast_transpose`` (fp8 ``dy`` for dgrad, ``dy^T`` for
      wgrad; the bias gradient fused in: no separate bias reduction), and for
      ``LayerNormLinear`` the ``transpose`` of its saved fp8 input for wgrad.

    Under sequence parallelism TE 1.x casts a row-parallel ``dy`` on the local rows and
    transposes it once gathered (3 / tp + 2 bytes an element of ``(T, h)``, against the 4 / tp
    that `sequence_parallel`'s row split makes of this ``(T, h)`` cast-transpose), and a ``Linear``
    casts its input forward and transposes it backward (5 bytes, not 4)."""
    n_in, n_out = dims
    cast = "cast_transpose" if train else "cast"
    fw = () if fused_norm else (fp8_cast(cast, rows, n_in),)
    bw = [fp8_cast("cast_transpose", rows, n_out)]
    if fused_norm:
        bw.append(fp8_cast("transpose", rows, n_in))
    return fw, tuple(bw)


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
        return r.flash_attention("flash_attention", (bh, z.S, z.keys, z.d), dt, causal=causal)
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


def _ffn(m: ModelSpec, z: Sizes, rows: int, *, train: bool, moe: bool = False) -> list[FrameworkOp]:
    """The MLP on ``rows`` tokens: TE linears (fc1 fused with the post-norm in a dense layer,
    Megatron-core's TELayerNormColumnParallelLinear; an expert's fc1 a plain TE linear after
    the MoE layer's own norm and router) around the fused activation function."""
    bias, act_dt = m.bias, activation_dtype(z.dt)

    def lin(name: str, dims: tuple[int, int], *, first: bool) -> FrameworkOp:
        fused = first and not moe
        return te_linear(name, rows, dims, z.dt, bias=bias, fused_norm=fused, train=train)

    if m.activation == "swiglu":
        return [
            lin("fc_gate_up", (z.H, 2 * z.F), first=True),
            r.elementwise("swiglu", "mul", (rows, z.F), act_dt),
            lin("fc_down", (z.F, z.H), first=False),
        ]
    act = "relu" if m.activation == "relu" else "gelu"
    return [
        lin("fc1", (z.H, z.F), first=True),
        r.elementwise(f"bias_{act}", act, (rows, z.F), act_dt),
        lin("fc2", (z.F, z.H), first=False),
    ]


def _moe_ffn(m: ModelSpec, z: Sizes, *, train: bool) -> list[FrameworkOp]:
    """A MoE layer's MLP: router and token permutes (bf16: no TE module), then the experts."""
    # Megatron-core caps each expert at ceil(f * local tokens * k / E) (router's
    # topk_softmax_with_capacity, capacity_factor f): proportional to a micro-batch's
    # tokens, i.e. a per-sequence cap (`ModelSpec.expert_capacity` = f s k / E) once per
    # sequence of the micro-batch; under cp `stagecost.shard_model` scales it to s / cp.
    # An expert no routed row reaches runs nothing (`moe_routing.expert_groups`).
    dt = activation_dtype(z.dt)
    # the permutes move the rows the experts run: those a capacity keeps (Megatron-core's
    # dispatcher permutes num_out_tokens = the kept rows, dropless: tokens x k)
    routed = (routed_rows(m, z.T, z.B), z.H)
    experts = [
        op
        for rows, n in expert_groups(m, z.T, z.B)
        for op in _ffn(m, z, rows, train=train, moe=True) * n
    ]
    return [
        r.linear("router", z.T, (z.H, m.num_experts), dt, bias=False),
        r.memory("permute", "copy", routed, dt, bw_op="copy"),
        *experts,
        r.memory("unpermute", "copy", routed, dt, bw_op="copy"),
    ]


def _layer(m: ModelSpec, run: Workload, z: Sizes) -> list[FrameworkOp]:
    """One transformer layer: TE linears in the workload's dtype, the rest in `a.dt`."""
    a = replace(z, dt=activation_dtype(z.dt))
    train = run.mode == "train"
    qkv = (z.nh + 2 * z.kv) * z.d
    moe = m.num_experts > 1
    ffn = _moe_ffn(m, z, train=train) if moe else _ffn(m, z, z.T, train=train)
    kv_shape = (z.T, 2 * z.kv * z.d)  # in the dtype attention reads it in (bf16 for fp8)
    flash = [flash_attention(a, causal=m.causal)]
    attention = flash if run.attention == "flash" else unfused_attention(a)
    qkv_op = te_linear("qkv", z.T, (z.H, qkv), z.dt, bias=m.bias, fused_norm=True, train=train)
    proj = te_linear("proj", z.T, (z.nh * z.d, z.H), z.dt, bias=m.bias, train=train)
    return [
        _norm("input_norm", m, a),
        qkv_op,
        # a static KV cache (Megatron's inference): the pass's K and V written into it
        *([r.memory("kv_cache_write", "copy", kv_shape, run.kv_dtype)] if z.cache else []),
        *attention,
        proj,
        r.elementwise("bias_dropout_add", "add", (z.T, z.H), a.dt),
        _norm("post_norm", m, a),
        *ffn,
        r.elementwise("bias_dropout_add_2", "add", (z.T, z.H), a.dt),
    ]


def decoder(m: ModelSpec, run: Workload) -> tuple[Block, ...]:
    """Embedding, ``num_layers`` fused layers, final norm and output head (under fp8 all but
    the layers' TE linears in bf16: module docstring)."""
    z = sizes(m, run)
    a = replace(z, dt=activation_dtype(z.dt))
    e = m.embed_width  # OPT's word_embed_proj_dim: projected to and from the hidden size
    embed = [r.embedding("tokens", z.T, (z.V, e), a.dt)]
    head = [_norm("final_norm", m, a)]
    if e != z.H:
        embed.append(r.linear("project_in", z.T, (e, z.H), a.dt, bias=False))
        head.append(r.linear("project_out", z.T, (z.H, e), a.dt, bias=False))
    if m.position == "learned":  # GPT/BERT/OPT: word + position embeddings (rotary: none)
        embed += [
            r.embedding("positions", z.S, (m.max_positions, z.H), a.dt),
            r.elementwise("add_positions", "add", (z.T, z.H), a.dt),
        ]
    output = r.linear("output", z.logit_rows, (e, z.V), a.dt, bias=False)
    head.append(r.tie(output, m.tied_embeddings))
    return (
        Block("embed", tuple(embed)),
        Block("layer", tuple(_layer(m, run, z)), m.num_layers),
        Block("head", tuple(head)),
    )


MEGATRON_INVENTORIES: dict[str, Callable[[ModelSpec, Workload], tuple[Block, ...]]] = {
    "gpt2": decoder,
    "opt": decoder,
    "bert": decoder,
    "llama": decoder,
    "mixtral": decoder,
}
