"""Kernels of one TP shard and their times per block: the compute side of a pipeline stage.

A shard is the model as one GPU of a TP x CP x EP group sees it: heads, KV heads, FFN width
and vocabulary divided by ``tp``, the sequence by ``cp``, experts by ``ep``; the op inventory
(`opgraph.inventory`) then lists its kernels for one micro-batch. Rules applied on top:

* sequence parallelism: the row-wise ops over ``(tokens, hidden)`` that tensor parallelism
  leaves whole (norms, dropout-add; `sequence_parallel_block`) run on ``tokens / tp`` rows, and
  so do a MoE layer's router and token permutes (``megatron``);
* context parallelism: the attention core runs ``cp`` ring steps of ``(S/cp) x (S/cp)``
  blocks; causal, TransformerEngine's load-balanced ring (``AttnFuncWithCPAndKVP2P``: rank
  ``r`` holds chunks ``r`` and ``2cp - 1 - r`` of ``2cp``) runs step 0 causal over its own
  ``S/cp`` tokens and ``cp - 1`` unmasked half steps, ``S/cp`` queries against the first half
  of a lower rank's K,V or the second ``S/(2cp)`` queries against a higher rank's: ``c (S + 1)``
  pairs per rank at ``c = S / (2cp)``, the causal matrix over ``cp``. Rank ``cp - 1`` runs
  every half step as the first kind, rank 0 as the second, the others a mix; the slowest rank
  sets the layer, so each half step is priced at the slower kernel (`ShardKernels.ring_fw`);
* recomputation: ``full`` re-runs each layer's forward before its backward, ``selective``
  re-runs the attention core only (Korthikanti et al. 2022);
* unfused attention (`SimInputs.attention`, ``megatron`` only): passed to the inventory as
  `Workload.attention` (`inventory_megatron.unfused_attention`);
* the loss (``megatron``): Megatron's vocabulary-parallel cross-entropy on the ``(tokens, V/t)``
  logits, in fp32 (16-bit logits are cast up first and the gradient cast back): max, subtract,
  exp, sum and divide (four read-write passes of the logits) forward, one scaling pass backward.

`kernels_for` lists every kernel a layout needs so that the caller forecasts them once
(`forecast_table`) and reuses the table across layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from forecast.kernels import (
    ATTENTION_BACKWARD_OPS,
    CAUSAL_ATTENTION_OPS,
    ITEMSIZE_BYTES,
    ROW_FAMILIES,
    Dtype,
    KernelSpec,
    OpFamily,
)
from forecast.predict import LatencyTable
from simulator import oprules as r
from simulator.errors import ConfigError
from simulator.inventory_hf import Sizes, sizes
from simulator.inventory_megatron import activation_dtype
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload, inventory, te_fp8
from simulator.oprules import FrameworkOp
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs

ATTENTION_OPS = frozenset(
    {"flash_attention", "qk", "scale", "mask", "mask_add", "mask_clamp", "softmax"}
    | {"attn_dropout", "av"}
)
# Megatron's column-parallel linears: in backward their input-gradient all-reduce (or, with
# sequence parallelism, the input re-gather and the gradient reduce-scatter) is issued
# asynchronously and overlaps the layer's own GEMMs (`RunConfig.tp_comm_overlap`).
COLUMN_PARALLEL = frozenset({"qkv", "fc1", "fc_gate_up"})
# The optimizer step streams every local parameter's state through HBM; bytes per parameter
# for Megatron-LM's mixed-precision optimizer with apex FusedAdam (fp32 p, g, m, v read, p, m,
# v written: 28 B) plus, for fp16, the 16-bit grad -> fp32 main grad cast (6 B) and the
# loss-scale unscale/inf check (8 B); the grad-norm read (4 B); the fp32 -> 16-bit weight copy
# (6 B); zeroing the grad buffer (2 B fp16, 4 B fp32). fp32 training: norm, Adam, zeroing.
# fp8 (TransformerEngine) is bf16's plus the weights' fp8 cast and transpose, once a step (on
# the first micro-batch, ``is_first_microbatch``): the bf16 weight read, two fp8 copies
# written (4 B; counted on every parameter, the GEMM weights being nearly all of them).
OPTIMIZER_BYTES_PER_PARAM: dict[Dtype, float] = {
    Dtype.FP16: 6 + 8 + 4 + 28 + 6 + 2,
    Dtype.BF16: 4 + 28 + 6 + 4,
    Dtype.FP8: 4 + 28 + 6 + 4 + 4,
    Dtype.FP32: 4 + 28 + 4,
    Dtype.TF32: 4 + 28 + 4,
}
# Priced at the bandwidth of a long streaming copy (512 MiB of traffic: multi-tensor apply
# works over all parameters, far from launch-bound).
ADAM_REF = KernelSpec(OpFamily.MEMORY, (1024, 65536), Dtype.FP32, "copy")

Counted = tuple[tuple[KernelSpec, int], ...]


@dataclass(frozen=True, slots=True)
class ShardKernels:
    """Kernels (with launch counts) of one micro-batch on one shard, per block and phase.

    ``col_dgrad`` / ``col_wgrad``: the input-gradient and weight-gradient GEMMs of a layer's
    column-parallel linears, as (attention, MLP) groups (attention alone in a MoE layer): the
    work that each group's async TP collective overlaps in backward (empty outside
    ``megatron``). ``attention_fw`` / ``attention_bw``: the attention core of CP ring step 0
    (the layer's own, in ``layer_*``); ``ring_fw`` / ``ring_bw``: the kernels of each other step,
    as alternatives of which the slower sets the step (`ring_steps`; empty at cp 1).
    """

    embed_fw: Counted
    embed_bw: Counted
    layer_fw: Counted
    layer_bw: Counted
    attention_fw: Counted
    attention_bw: Counted
    head_fw: Counted
    head_bw: Counted
    col_dgrad: tuple[Counted, ...]
    col_wgrad: tuple[Counted, ...]
    optimizer_bytes_per_param: float
    ring_fw: tuple[Counted, ...] = ()
    ring_bw: tuple[Counted, ...] = ()

    def all(self) -> set[KernelSpec]:
        """Every distinct kernel, plus the optimizer's reference kernel."""
        groups = (self.embed_fw, self.embed_bw, self.layer_fw, self.layer_bw, self.head_fw)
        rings = (*self.ring_fw, *self.ring_bw)
        return {k for g in (*groups, self.head_bw, *rings) for k, _ in g} | {ADAM_REF}


@dataclass(frozen=True, slots=True)
class BlockTimes:
    """Seconds per micro-batch on one shard; ``layer_*`` for one layer.

    ``col_dgrad_s`` / ``col_wgrad_s``: backward GEMMs of the (attention, MLP) column-parallel
    linears.
    """

    embed_fw_s: float
    embed_bw_s: float
    layer_fw_s: float
    layer_bw_s: float
    attention_fw_s: float
    attention_bw_s: float  # the backward of `attention_fw_s`: what a CP ring step hides behind
    head_fw_s: float
    head_bw_s: float
    adam_s_per_param: float
    col_dgrad_s: tuple[float, ...]
    col_wgrad_s: tuple[float, ...]


def tp_shard(model: ModelSpec, tp: int) -> ModelSpec:
    """The part of ``model`` one of ``tp`` tensor-parallel GPUs holds: ``1 / tp`` of the
    heads, FFN columns and vocabulary; KV heads too, one a GPU where ``tp`` exceeds them
    (replicated, as vLLM serves; training requires tp to divide them, `parallel.check_run`)."""
    return model.model_copy(
        update={
            "num_heads": model.num_heads // tp,
            "num_kv_heads": max(1, model.kv_heads // tp),
            "head_dim": model.dhead,
            "ffn_hidden_size": -(-model.ffn_hidden_size // tp),
            "vocab_size": -(-model.vocab_size // tp),
        }
    )


def shard_model(model: ModelSpec, run: RunConfig) -> ModelSpec:
    """The model one TP/EP shard holds."""
    return tp_shard(model, run.tp).model_copy(
        update={
            # the router still scores all experts; the shard runs its own E/ep (one at ep = E:
            # still an expert layer, routed and permuted, not a dense FFN)
            "local_experts": model.num_experts // run.ep,
            # a capacity is a share of the routed tokens (Megatron-core's capacity factor over
            # a rank's local tokens): a shard's s / cp of a sequence keeps 1 / cp of its cap
            "expert_capacity": -(-model.expert_capacity // run.cp),
        }
    )


def _sp_kernel(k: KernelSpec, whole: KernelSpec, tokens: int, hidden: int, tp: int) -> KernelSpec:
    """``k`` on ``tokens / tp`` rows where it is a row-wise kernel over ``(tokens, hidden)``
    that tensor parallelism leaves whole (``whole``: the same kernel of the unsplit model)."""
    rows = {tokens, tokens * 3 // 2, tokens // 2}
    if (
        k == whole
        and k.family in ROW_FAMILIES
        and len(k.dims) == 2
        and k.dims[1] == hidden
        and k.dims[0] in rows
    ):
        return KernelSpec(k.family, (max(1, k.dims[0] // tp), hidden), k.dtype, k.op)
    return k


def _expand(
    fop: FrameworkOp, dtype: Dtype, *, backward: bool, fused_wgrad: bool = False
) -> list[KernelSpec]:
    """One phase's kernels of ``fop``; the backward's with a gradient-accumulation ``add`` per
    parameter tensor, but for a linear's weight under ``fused_wgrad`` (its weight-gradient
    GEMM accumulates into the main gradient itself: `RunConfig.grad_accumulation_fusion`)."""
    out = list(fop.bw) if backward else list(fop.fw)
    if backward:
        linear = any(k.family is OpFamily.LINEAR for k in fop.bw)
        params = fop.params[1:] if fused_wgrad and linear else fop.params
        out += [KernelSpec(OpFamily.ELEMENTWISE, s, dtype, "add") for s in params]
    return out


# A MoE layer's router and token permutes (`inventory_megatron.decoder`). Under sequence
# parallelism a TP rank routes and permutes its own s/tp tokens: Megatron-core's MoELayer runs
# the router on the sequence-parallel hidden states, and the token dispatcher permutes their
# ``num_local_tokens x k`` rows before its all-to-all and unpermutes as many after it.
MOE_LOCAL_OPS = frozenset({"router", "permute", "unpermute"})


def _own_tokens(fop: FrameworkOp, tp: int) -> FrameworkOp:
    """A router or permute of `inventory_megatron.decoder` on ``1 / tp`` of its rows."""
    k = fop.fw[0]
    if fop.name == "router":
        _, rows, h, experts = k.dims
        return r.linear(fop.name, max(1, rows // tp), (h, experts), k.dtype, bias=False)
    rows, h = k.dims
    bw_op = fop.bw[0].op if fop.bw else ""
    return r.memory(fop.name, k.op, (max(1, rows // tp), h), k.dtype, bw_op=bw_op)


def sequence_parallel_block(block: Block, whole: Block, w: Workload, tp: int) -> Block:
    """A TP shard's ``block`` under sequence parallelism: its row-wise kernels over ``(tokens,
    h)`` that tensor parallelism leaves whole (equal in the unsplit model's ``whole`` block:
    norms, dropout-adds, a row-parallel linear's bias gradient) on ``tokens / tp`` rows, and a
    MoE layer's router and permutes on its own tokens (``megatron``). By shape alone, an FFN
    activation of ``F / tp = h`` columns (GPT at tp 4) passed for a norm's input and was split
    a second time; comparing with ``whole`` tells them apart."""
    if [f.name for f in block.ops] != [f.name for f in whole.ops]:
        raise ValueError(f"{block.name}: the TP shard's ops differ from the unsplit model's")
    hidden = _hidden_of(block)

    def split(ks: tuple[KernelSpec, ...], wks: tuple[KernelSpec, ...]) -> tuple[KernelSpec, ...]:
        return tuple(_sp_kernel(k, o, w.tokens, hidden, tp) for k, o in zip(ks, wks, strict=True))

    ops = [
        _own_tokens(fop, tp)
        if w.framework == "megatron" and fop.name in MOE_LOCAL_OPS
        else replace(fop, fw=split(fop.fw, one.fw), bw=split(fop.bw, one.bw))
        for fop, one in zip(block.ops, whole.ops, strict=True)
    ]
    return replace(block, ops=tuple(ops))


def _block_kernels(
    block: Block, w: Workload, *, backward: bool, only: frozenset[str], fused_wgrad: bool
) -> Counted:
    """``block``'s kernels of one phase (of its ops named ``only``, if given); the gradient
    adds in bf16 under TransformerEngine's fp8 (its weight-gradient GEMMs write bf16)."""
    grad_dtype = Dtype.BF16 if te_fp8(w.dtype, w.framework) else w.dtype
    ks: list[KernelSpec] = []
    for fop in block.ops:
        if not only or fop.name in only:
            ks += _expand(fop, grad_dtype, backward=backward, fused_wgrad=fused_wgrad)
    return tuple((k, 1) for k in ks)


def _hidden_of(block: Block) -> int:
    for fop in block.ops:
        for k in fop.fw:
            if k.family is OpFamily.LAYERNORM:
                return k.dims[1]
    return -1


def _with_loss(head: Block, z: Sizes) -> Block:
    """The head plus Megatron's vocab-parallel cross-entropy over fp32 logits (see above)."""
    fp32 = Dtype.FP32
    rows, vocab = z.T, z.V
    passes = KernelSpec(OpFamily.SOFTMAX, (4 * rows, vocab), fp32)  # 4 read+write passes
    scale = KernelSpec(OpFamily.ELEMENTWISE, (rows, vocab), fp32, "mulu")
    loss = FrameworkOp("cross_entropy", (passes,), (scale,))
    ops = [*head.ops, loss]
    dt = activation_dtype(z.dt)  # bf16 logits under fp8 (the output layer is no TE linear)
    if ITEMSIZE_BYTES[dt] < 4:  # 16-bit -> fp32 cast and back: 6 bytes per logit each way
        cast = KernelSpec(OpFamily.MEMORY, (rows, 3 * vocab // 2), dt, "copy")
        ops.insert(len(head.ops), FrameworkOp("logits_cast", (cast,), (cast,)))
    return Block(head.name, tuple(ops), head.repeat, head.host_ops)


def ring_steps(step0: Counted, cp: int) -> tuple[Counted, ...]:
    """The kernels of one CP ring step after the first, as alternatives (module docstring):
    a causal core's two unmasked half steps, the ``S/cp x S/(2cp)`` and ``S/(2cp) x S/cp``
    blocks; any other core (non-causal, GEMM-shaped or unfused) its step-0 kernels again."""
    if cp == 1:
        return ()
    if not any(k.op in CAUSAL_ATTENTION_OPS for k, _ in step0):
        return (step0,)

    def half(queries: bool) -> Counted:
        out: list[tuple[KernelSpec, int]] = []
        for k, n in step0:
            if k.op in CAUSAL_ATTENTION_OPS:
                bh, s_q, s_kv, d = k.dims
                q, kv = (max(1, s_q // 2), s_kv) if queries else (s_q, max(1, s_kv // 2))
                op = "attention_bwd" if k.op in ATTENTION_BACKWARD_OPS else "attention"
                k = KernelSpec(k.family, (bh, q, kv, d), k.dtype, op)
            out.append((k, n))
        return tuple(out)

    return (half(queries=False), half(queries=True))


def _column_gemms(layer: Block, w: Workload, *, wgrad: bool) -> tuple[Counted, ...]:
    """(attention, MLP) groups of column-parallel backward GEMMs; (attention,) in a MoE
    layer, whose expert linears run no async collective (Megatron-core's explicit_expert_comm:
    the token dispatcher gathers and scatters their tokens, `comm`)."""
    if w.framework != "megatron":
        return ()
    index = 1 if wgrad else 0  # `oprules.linear` backward: (dgrad, wgrad, bias)
    cols = [f for f in layer.ops if f.name in COLUMN_PARALLEL]
    attn = tuple((f.bw[index], 1) for f in cols if f.name == "qkv")
    if any(f.name == "router" for f in layer.ops):
        return (attn,)
    mlp = tuple((f.bw[index], 1) for f in cols if f.name != "qkv")
    return (attn, mlp)


def _sequence_parallel_blocks(
    inputs: SimInputs, run: RunConfig, w: Workload, blocks: tuple[Block, Block, Block]
) -> tuple[Block, Block, Block]:
    """The TP shard's embed, layer and head under sequence parallelism
    (`sequence_parallel_block`, against the unsplit model's same blocks)."""
    unsplit = shard_model(inputs.model, run.model_copy(update={"tp": 1}))
    whole = {b.name: b for b in inventory(unsplit, w)}
    if inputs.framework == "megatron":
        whole["head"] = _with_loss(whole["head"], sizes(unsplit, w))
    embed, layer, head = (sequence_parallel_block(b, whole[b.name], w, run.tp) for b in blocks)
    return embed, layer, head


def shard_kernels(inputs: SimInputs, run: RunConfig) -> ShardKernels:
    """One micro-batch's kernels on one shard, per block and phase."""
    w = Workload(
        batch=run.micro_batch_size,
        seq=inputs.seq_len // run.cp,
        framework=inputs.framework,
        dtype=inputs.dtype,
        attention=inputs.attention,
    )
    shard = shard_model(inputs.model, run)
    blocks = {b.name: b for b in inventory(shard, w)}
    if "layer" not in blocks:  # Switch: encoder and decoder stacks of dense and MoE layers
        raise ConfigError(
            f"model: {inputs.model.id} ({inputs.model.architecture}) has no one repeated layer "
            "to split into pipeline stages; the distributed simulator takes decoder-only or "
            "encoder-only models (gpt2, opt, bert, llama, mixtral)"
        )
    embed, layer, head = blocks["embed"], blocks["layer"], blocks["head"]
    if inputs.framework == "megatron":
        z = sizes(shard, w)
        head = _with_loss(head, z)
    if run.sequence_parallel and run.tp > 1:
        embed, layer, head = _sequence_parallel_blocks(inputs, run, w, (embed, layer, head))
    fused = run.grad_accumulation_fusion and inputs.framework == "megatron"

    def kernels(block: Block, *, backward: bool, only: frozenset[str] = frozenset()) -> Counted:
        return _block_kernels(block, w, backward=backward, only=only, fused_wgrad=fused)

    attention_fw = kernels(layer, backward=False, only=ATTENTION_OPS)
    attention_bw = kernels(layer, backward=True, only=ATTENTION_OPS)
    return ShardKernels(
        embed_fw=kernels(embed, backward=False),
        embed_bw=kernels(embed, backward=True),
        layer_fw=kernels(layer, backward=False),
        layer_bw=kernels(layer, backward=True),
        attention_fw=attention_fw,
        attention_bw=attention_bw,
        head_fw=kernels(head, backward=False),
        head_bw=kernels(head, backward=True),
        col_dgrad=_column_gemms(layer, w, wgrad=False),
        col_wgrad=_column_gemms(layer, w, wgrad=True),
        optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM[inputs.dtype],
        ring_fw=ring_steps(attention_fw, run.cp),
        ring_bw=ring_steps(attention_bw, run.cp),
    )


def kernels_for(inputs: SimInputs, runs: list[RunConfig]) -> set[KernelSpec]:
    """Every kernel the layouts need: forecast these once, then simulate them all."""
    return {k for run in runs for k in shard_kernels(inputs, run).all()}


def _sum_s(kernels: Counted, table: LatencyTable) -> float:
    return sum(table[k] * n for k, n in kernels)


def _ring_s(ring: tuple[Counted, ...], table: LatencyTable, run: RunConfig) -> float:
    """The ``cp - 1`` ring steps after the first on the slowest rank: each the slower of its
    alternatives (rank 0 runs every step as one, rank ``cp - 1`` as the other)."""
    return (run.cp - 1) * max((_sum_s(r, table) for r in ring), default=0.0)


def block_times(sk: ShardKernels, table: LatencyTable, run: RunConfig) -> BlockTimes:
    """Seconds per block and phase for one micro-batch (recompute not yet added)."""
    ring_fw = _ring_s(sk.ring_fw, table, run)
    ring_bw = _ring_s(sk.ring_bw, table, run)  # its own kernels (FA2: ~2.7x forward)
    attn_fw = _sum_s(sk.attention_fw, table) + ring_fw
    attn_bw = _sum_s(sk.attention_bw, table) + ring_bw
    layer_fw = _sum_s(sk.layer_fw, table) + ring_fw
    layer_bw = _sum_s(sk.layer_bw, table) + ring_bw
    return BlockTimes(
        embed_fw_s=_sum_s(sk.embed_fw, table),
        embed_bw_s=_sum_s(sk.embed_bw, table),
        layer_fw_s=layer_fw,
        layer_bw_s=layer_bw,
        attention_fw_s=attn_fw,
        attention_bw_s=attn_bw,
        head_fw_s=_sum_s(sk.head_fw, table),
        head_bw_s=_sum_s(sk.head_bw, table),
        adam_s_per_param=sk.optimizer_bytes_per_param * table[ADAM_REF] / ADAM_REF.bytes(),
        col_dgrad_s=tuple(_sum_s(g, table) for g in sk.col_dgrad),
        col_wgrad_s=tuple(_sum_s(g, table) for g in sk.col_wgrad),
    )
