"""Kernels of one TP shard and their times per block: the compute side of a pipeline stage.

A shard is the model as one GPU of a TP x CP x EP group sees it: heads, KV heads, FFN width
and vocabulary divided by ``tp``, the sequence by ``cp``, experts by ``ep``; the op inventory
(`opgraph.inventory`) then lists its kernels for one micro-batch. Rules applied on top:

* sequence parallelism (`sequence_parallel`): the row-wise ops over ``(tokens, hidden)`` that
  tensor parallelism leaves whole run on ``tokens / tp`` rows, and so do a MoE layer's router
  and token permutes (``megatron``);
* context parallelism (`context_parallel`): the p2p ring's attention core runs ``cp`` ring
  steps, the ``cp - 1`` after the first each priced at the slower of its alternatives
  (`ring_steps`); ``all_gather`` and ``a2a`` run their own kernels in its place, the slowest
  rank's setting the layer (`schedule_core`);
* recomputation: ``full`` re-runs each layer's forward before its backward, ``selective``
  re-runs the attention core only (Korthikanti et al. 2022);
* unfused attention (`SimInputs.attention`, ``megatron`` only): passed to the inventory as
  `Workload.attention` (`inventory_megatron.unfused_attention`);
* the loss (``megatron``, `loss.add_loss`): Megatron's vocabulary-parallel cross-entropy on
  the ``(tokens, V/t)`` logits, in fp32.

`kernels_for` lists every kernel a layout needs so that the caller forecasts them once
(`forecast_table`) and reuses the table across layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyTable
from simulator.context_parallel import Counted, RingTimes, ring_steps, schedule_core, without
from simulator.errors import ConfigError
from simulator.inventory_hf import sizes
from simulator.loss import add_loss
from simulator.models import ModelSpec
from simulator.opgraph import Block, Workload, inventory, te_fp8
from simulator.oprules import FrameworkOp
from simulator.optimizer_step import ADAM_REF, OPTIMIZER_BYTES_PER_PARAM, optimizer_s_per_param
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs
from simulator.sequence_parallel import sequence_parallel_block

ATTENTION_OPS = frozenset(
    {"flash_attention", "qk", "scale", "mask", "mask_add", "mask_clamp", "softmax"}
    | {"attn_dropout", "av"}
)
# Megatron's column-parallel linears: in backward their input-gradient all-reduce (or, with
# sequence parallelism, the input re-gather and the gradient reduce-scatter) is issued
# asynchronously and overlaps the layer's own GEMMs (`RunConfig.tp_comm_overlap`).
COLUMN_PARALLEL = frozenset({"qkv", "fc1", "fc_gate_up"})


@dataclass(frozen=True, slots=True)
class ShardKernels:
    """Kernels (with launch counts) of one micro-batch on one shard, per block and phase.

    ``col_dgrad`` / ``col_wgrad``: the input-gradient and weight-gradient GEMMs of a layer's
    column-parallel linears, as (attention, MLP) groups (attention alone in a MoE layer): the
    work that each group's async TP collective overlaps in backward (empty outside
    ``megatron``). ``attention_fw`` / ``attention_bw``: the attention core of CP ring step 0
    (the layer's own, in ``layer_*``); ``ring_fw`` / ``ring_bw``: the kernels of each other step,
    as alternatives of which the slower sets the step (`ring_steps`; empty at cp 1).
    ``core_fw`` / ``core_bw``: the attention core of ``all_gather`` or ``a2a`` as alternatives
    of which the slowest sets the layer (`schedule_core`); where they are set, ``layer_*`` and
    ``attention_*`` leave ring step 0 out and ``ring_*`` are empty.
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
    core_fw: tuple[Counted, ...] = ()
    core_bw: tuple[Counted, ...] = ()

    def all(self) -> set[KernelSpec]:
        """Every distinct kernel, plus the optimizer's reference kernel."""
        groups = (self.embed_fw, self.embed_bw, self.layer_fw, self.layer_bw, self.head_fw)
        rings = (*self.ring_fw, *self.ring_bw, *self.core_fw, *self.core_bw)
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
    ring: RingTimes  # the attention core per CP ring step (what each send hides)


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


def _workload(inputs: SimInputs, run: RunConfig) -> Workload:
    """One micro-batch on one shard: ``1 / cp`` of each sequence."""
    return Workload(
        batch=run.micro_batch_size,
        seq=inputs.seq_len // run.cp,
        framework=inputs.framework,
        dtype=inputs.dtype,
        attention=inputs.attention,
    )


def _blocks(inputs: SimInputs, run: RunConfig, w: Workload) -> tuple[Block, Block, Block]:
    """The shard's embed, layer and head blocks, the head with its loss (``megatron``)."""
    shard = shard_model(inputs.model, run)
    blocks = {b.name: b for b in inventory(shard, w)}
    if "layer" not in blocks:  # Switch: encoder and decoder stacks of dense and MoE layers
        raise ConfigError(
            f"model: {inputs.model.id} ({inputs.model.architecture}) has no one repeated layer "
            "to split into pipeline stages; the distributed simulator takes decoder-only or "
            "encoder-only models (gpt2, opt, bert, llama, mixtral)"
        )
    head = blocks["head"]
    if inputs.framework == "megatron":
        head = add_loss(head, sizes(shard, w))
    return blocks["embed"], blocks["layer"], head


def _shard_blocks(inputs: SimInputs, run: RunConfig, w: Workload) -> tuple[Block, Block, Block]:
    """`_blocks`, under sequence parallelism split against the unsplit model's same blocks
    (`sequence_parallel_block`)."""
    embed, layer, head = _blocks(inputs, run, w)
    if not (run.sequence_parallel and run.tp > 1):
        return embed, layer, head
    whole = _blocks(inputs, run.model_copy(update={"tp": 1}), w)
    embed, layer, head = (
        sequence_parallel_block(b, o, w, run.tp)
        for b, o in zip((embed, layer, head), whole, strict=True)
    )
    return embed, layer, head


def shard_kernels(inputs: SimInputs, run: RunConfig) -> ShardKernels:
    """One micro-batch's kernels on one shard, per block and phase."""
    w = _workload(inputs, run)
    embed, layer, head = _shard_blocks(inputs, run, w)
    fused = run.grad_accumulation_fusion and inputs.framework == "megatron"

    def kernels(block: Block, *, backward: bool, only: frozenset[str] = frozenset()) -> Counted:
        return _block_kernels(block, w, backward=backward, only=only, fused_wgrad=fused)

    attention_fw = kernels(layer, backward=False, only=ATTENTION_OPS)
    attention_bw = kernels(layer, backward=True, only=ATTENTION_OPS)
    layer_fw, layer_bw = kernels(layer, backward=False), kernels(layer, backward=True)
    core_fw = schedule_core(run.cp_comm_type, attention_fw, run.cp)
    core_bw = schedule_core(run.cp_comm_type, attention_bw, run.cp)
    if core_fw:  # all_gather / a2a: their own core in place of ring step 0
        layer_fw, layer_bw = without(layer_fw, attention_fw), without(layer_bw, attention_bw)
        attention_fw = attention_bw = ()
    return ShardKernels(
        embed_fw=kernels(embed, backward=False),
        embed_bw=kernels(embed, backward=True),
        layer_fw=layer_fw,
        layer_bw=layer_bw,
        attention_fw=attention_fw,
        attention_bw=attention_bw,
        head_fw=kernels(head, backward=False),
        head_bw=kernels(head, backward=True),
        col_dgrad=_column_gemms(layer, w, wgrad=False),
        col_wgrad=_column_gemms(layer, w, wgrad=True),
        optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM[inputs.dtype],
        ring_fw=ring_steps(attention_fw, run.cp) if not core_fw else (),
        ring_bw=ring_steps(attention_bw, run.cp) if not core_fw else (),
        core_fw=core_fw,
        core_bw=core_bw,
    )


def kernels_for(inputs: SimInputs, runs: list[RunConfig]) -> set[KernelSpec]:
    """Every kernel the layouts need: forecast these once, then simulate them all."""
    return {k for run in runs for k in shard_kernels(inputs, run).all()}


def _sum_s(kernels: Counted, table: LatencyTable) -> float:
    return sum(table[k] * n for k, n in kernels)


def _step_s(ring: tuple[Counted, ...], table: LatencyTable) -> float:
    """One ring step after the first on the slowest rank: the slower of its alternatives
    (rank 0 runs every step as one, rank ``cp - 1`` as the other)."""
    return max((_sum_s(r, table) for r in ring), default=0.0)


def _ring_s(ring: tuple[Counted, ...], table: LatencyTable, run: RunConfig) -> float:
    """The ``cp - 1`` ring steps after the first on the slowest rank (`_step_s` each)."""
    return (run.cp - 1) * _step_s(ring, table)


def block_times(sk: ShardKernels, table: LatencyTable, run: RunConfig) -> BlockTimes:
    """Seconds per block and phase for one micro-batch (recompute not yet added)."""
    if sk.core_fw:  # all_gather / a2a: no ring, their own core on the slowest rank
        attn_fw, attn_bw = _step_s(sk.core_fw, table), _step_s(sk.core_bw, table)
        ring, core_fw, core_bw = RingTimes(), attn_fw, attn_bw
    else:  # the ring steps after the first (step 0 is the layer's own)
        core_fw = _ring_s(sk.ring_fw, table, run)
        core_bw = _ring_s(sk.ring_bw, table, run)  # its own kernels (FA2: ~2.7x forward)
        step0_fw, step0_bw = _sum_s(sk.attention_fw, table), _sum_s(sk.attention_bw, table)
        attn_fw = step0_fw + core_fw
        attn_bw = step0_bw + core_bw
        step_fw, step_bw = _step_s(sk.ring_fw, table), _step_s(sk.ring_bw, table)
        ring = RingTimes(step0_fw, step_fw, step0_bw, step_bw)
    layer_fw = _sum_s(sk.layer_fw, table) + core_fw  # the core the layer's list leaves out
    layer_bw = _sum_s(sk.layer_bw, table) + core_bw
    return BlockTimes(
        embed_fw_s=_sum_s(sk.embed_fw, table),
        embed_bw_s=_sum_s(sk.embed_bw, table),
        layer_fw_s=layer_fw,
        layer_bw_s=layer_bw,
        attention_fw_s=attn_fw,
        attention_bw_s=attn_bw,
        head_fw_s=_sum_s(sk.head_fw, table),
        head_bw_s=_sum_s(sk.head_bw, table),
        adam_s_per_param=optimizer_s_per_param(sk.optimizer_bytes_per_param, table),
        col_dgrad_s=tuple(_sum_s(g, table) for g in sk.col_dgrad),
        col_wgrad_s=tuple(_sum_s(g, table) for g in sk.col_wgrad),
        ring=ring,
    )
