"""Communication of one step: what each collective moves, priced by `topologies`.

Bytes per collective (nccl-tests size S; ``A = micro_batch * seq/cp * hidden * itemsize``,
the itemsize of the hidden states: bf16 under fp8 training, where TransformerEngine runs only
the GEMMs in fp8 and Megatron's collectives move bf16 tensors, except the layer's
sequence-parallel all-gathers, which TE quantizes first: ``A / 2``, `te_gather_bytes`):

* TP, per layer and micro-batch (Megatron column/row split): forward 2 all-reduces of ``A``;
  backward 2 more. With sequence parallelism each all-reduce becomes an all-gather plus a
  reduce-scatter of ``A`` (same bytes on the wire, norms on ``1/tp`` of the tokens), and in
  backward each column-parallel linear all-gathers its input again (Megatron keeps only the
  sequence-split input): 2 more all-gathers. The vocabulary-parallel embedding adds one
  forward all-reduce of ``A`` (with SP: a forward reduce-scatter, a backward all-gather); the
  output layer, whose input is copied to every TP rank, one backward all-reduce of ``A``
  (with SP: a forward all-gather of its input, a backward reduce-scatter; Megatron-LM's
  ``copy_to_tensor_model_parallel_region`` / ``gather_from_sequence_parallel_region``).
  Forward collectives block; in backward the column-parallel
  linears' collectives overlap their own GEMMs when ``tp_comm_overlap`` is set (`stepcosts`;
  ``tp_ar_s``/``tp_ag_s``/``tp_rs_s`` are one collective each).
* CP (ring attention, TransformerEngine's ``AttnFuncWithCPAndKVP2P``), per layer: each of the
  ``cp - 1`` forward ring steps sends a rank's ``2 b (s/cp) kv_heads dhead / tp`` K,V to the
  next rank, a point-to-point send and receive (``cp_kv_s``: its slowest hop); a rank saves
  one K,V, so backward circulates K,V again and the dK,dV with them, ``2 (cp - 1)`` volumes in
  ``cp`` steps, the middle ones one buffer of both (``cp_kv_grad_s``). Each send overlaps the
  attention core of its own step, so only each step's excess is exposed
  (`context_parallel.fw_exposed_s`); a recomputed attention core (selective or full recompute)
  runs its forward ring again (`stepcosts`). With ``cp_comm_type`` ``all_gather`` or ``a2a``
  the CP collectives instead block the attention core (``cp_fw_s``, ``cp_bw_s``; what
  `context_parallel.blocking_collectives` lists: all-gathers of K and V, reduce-scatters of
  dK and dV; or all-to-alls of Q, K, V and the output), again when it is recomputed.
* EP (MoE), per MoE layer: 2 all-to-alls of ``A * experts_per_token`` forward, 2 backward,
  ``/ tp`` with sequence parallelism (each TP rank dispatches its own ``s / tp`` tokens).
  Without sequence parallelism (tp 1) the whole micro-batch is dispatched. An expert capacity
  that binds drops rows before the dispatch: both move the kept share (`routed_share`).
* TP of a MoE layer's experts (Megatron-core's ``MoEAlltoAllTokenDispatcher``,
  megatron/core/transformer/moe/token_dispatcher.py): after the all-to-all the expert shards
  all-gather the routed tokens over TP (``gather_from_sequence_parallel_region``) and
  reduce-scatter the experts' output before the all-to-all back; each token goes to ``k =
  experts_per_token`` experts, so both move ``k * A`` (the kept share of it, `routed_share`).
  The expert linears run with ``explicit_expert_comm`` (no collective of their own, the
  gathered input saved whole): no backward re-gather, nothing overlapped with their GEMMs;
  backward runs the same two
  (the all-gather of the output gradient, the reduce-scatter of the input gradient); MoE with
  tp > 1 runs under sequence parallelism only (`parallel.check_run`, as Megatron-LM asserts).
  The attention's linears keep the dense pattern of ``A``
  (``tp_moe_s``: the expert half, one direction).
* PP: one send-recv of ``A / tp`` per stage boundary and micro-batch, each direction (Megatron's
  scatter/gather optimisation: each TP rank sends one slice, then the receiving TP group
  all-gathers ``A`` over its node fabric before the next stage can start; with sequence
  parallelism the activation is already split over TP and nothing is gathered).
* DP over the dp x cp group: gradients (fp32 main grads for fp32/bf16/fp8, 16-bit for fp16):
  all-reduce, or reduce-scatter plus an all-gather of the updated 16-bit parameters when the
  optimizer is sharded (ZeRO-1/2, distributed optimizer); ZeRO-3 gathers parameters before
  every forward and backward and reduce-scatters gradients after every backward, and so does
  ZeRO-2 with more than one micro-batch (it keeps only its share of the gradients:
  `stepcosts.scatters_every_backward`). Expert
  parameters (MoE) are their own buffer, reduced and gathered over the expert-data-parallel
  group instead: the dp x cp / ep ranks that hold the same experts (Megatron-LM's
  ``expert_data_parallel_group``), so each DP collective below is one over each group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from forecast.kernels import ITEMSIZE_BYTES
from simulator.context_parallel import blocking_collectives
from simulator.memory import (
    activation_itemsize_bytes,
    grad_itemsize_bytes,
    param_itemsize_bytes,
)
from simulator.opgraph import te_fp8
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.shard_params import end_tensors
from simulator.stagecost import shard_model
from topologies import Cluster, collective_estimate, collective_time_s
from topologies.algorithms import Op


def collective_s(op: Op, nbytes: float, ranks: Sequence[int], cluster: Cluster) -> float:
    """Seconds for one collective; 0 for a group of one rank or no data."""
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    return collective_estimate(op, nbytes, ranks, cluster).time_s


@dataclass(frozen=True, slots=True)
class LayerComm:
    """Seconds of communication per micro-batch: per layer (TP, CP, EP), embedding, PP hop."""

    tp_fw_s: float
    tp_bw_s: float
    tp_embed_fw_s: float
    tp_embed_bw_s: float
    tp_head_fw_s: float
    tp_head_bw_s: float
    cp_kv_s: float  # one CP ring step's send of a rank's K,V (`context_parallel`)
    cp_kv_grad_s: float  # one backward step's send of K,V with dK,dV
    ep_fw_s: float
    ep_bw_s: float
    pp_hop_s: float
    # One TP collective of ``A`` each: all-reduce without sequence parallelism, all-gather and
    # reduce-scatter with it (0.0 where the layout runs none); `stepcosts.tp_bw_exposed_s`.
    tp_ar_s: float
    tp_ag_s: float
    tp_rs_s: float
    # A MoE layer's expert half, one direction: the dispatcher's TP all-gather and
    # reduce-scatter of the ``k * A`` routed tokens, blocking; 0.0 for a dense layer (and at
    # tp 1, the one MoE layout without sequence parallelism). ``tp_pairs``: the linear pairs
    # whose collectives move ``A`` (attention and MLP; attention alone in a MoE layer).
    tp_moe_s: float = 0.0
    tp_pairs: int = 2
    # CP collectives that block the attention core (cp_comm_type all_gather or a2a), forward
    # and backward of one layer; 0.0 for the p2p ring (``cp_kv_s``, ``cp_kv_grad_s``)
    cp_fw_s: float = 0.0
    cp_bw_s: float = 0.0


def activation_bytes(inputs: SimInputs, layout: Layout) -> float:
    """``A``: one micro-batch's hidden states on one CP rank (bf16 under fp8 training:
    `memory.activation_itemsize_bytes`)."""
    run = layout.run
    tokens = run.micro_batch_size * inputs.seq_len // run.cp
    item = activation_itemsize_bytes(inputs.dtype, inputs.framework)
    return float(tokens * inputs.model.hidden_size * item)


def te_gather_bytes(inputs: SimInputs, layout: Layout) -> float:
    """What one of a layer's sequence-parallel all-gathers moves: ``A``, or under fp8 training
    ``A`` in fp8, as TransformerEngine quantizes before it gathers a column-parallel linear's
    input (module/layernorm_linear.py, ``gather_along_first_dim`` of the fp8 ``ln_out``, in
    the forward and again for the weight gradient) and a row-parallel linear's output gradient
    (module/base.py, ``grad_output_preprocess``: ``gather_along_first_dim(..., quantizer=...)``),
    without userbuffers too."""
    a = activation_bytes(inputs, layout)
    if not te_fp8(inputs.dtype, inputs.framework):
        return a
    return a * ITEMSIZE_BYTES[inputs.dtype] / activation_itemsize_bytes(inputs.dtype)


def layer_comm(inputs: SimInputs, layout: Layout) -> LayerComm:
    """Per-micro-batch communication of one layer (see the module docstring)."""
    run, cl, m = layout.run, inputs.cluster, inputs.model
    a = activation_bytes(inputs, layout)
    g = layout.tp_group
    sp = run.sequence_parallel
    ag = collective_s("all-gather", a, g, cl)  # Megatron's own: head, embedding, PP hop
    # the layer's linears' gathers (TransformerEngine's; fp8 under fp8 training)
    te_ag = collective_s("all-gather", te_gather_bytes(inputs, layout), g, cl) if sp else 0.0
    ar = 0.0 if sp else collective_s("all-reduce", a, g, cl)
    rs = collective_s("reduce-scatter", a, g, cl) if sp else 0.0
    tp_one = te_ag + rs if sp else ar
    tp_moe = _tp_moe_s(inputs, layout, a)
    moe = m.num_experts > 1  # every layer (`ModelSpec.moe_every` > 1 is Switch only)
    pairs = 1 if moe else 2  # linear pairs moving ``A``: attention (and a dense MLP)
    kv = 2 * run.micro_batch_size * inputs.seq_len * m.kv_heads * m.dhead / run.tp
    kv_bytes = kv * activation_itemsize_bytes(inputs.dtype, inputs.framework)  # bf16 under fp8
    ring = kv_bytes if run.cp_comm_type == "p2p" else 0.0
    cp_fw, cp_bw = _cp_blocking_s(inputs, layout, kv_bytes)
    ep = _ep_s(inputs, layout, a)
    return LayerComm(
        tp_fw_s=pairs * tp_one + tp_moe,
        tp_bw_s=pairs * (tp_one + te_ag) + tp_moe,
        tp_embed_fw_s=rs if sp else ar,
        tp_embed_bw_s=ag if sp else 0.0,
        tp_head_fw_s=ag if sp else 0.0,
        tp_head_bw_s=rs if sp else ar,
        cp_kv_s=_ring_step_s(ring / run.cp, layout.cp_group, cl),
        cp_kv_grad_s=_ring_step_s(2 * ring / run.cp, layout.cp_group, cl),
        ep_fw_s=ep,
        ep_bw_s=ep,
        pp_hop_s=max(
            (collective_s("send-recv", a / run.tp, h, cl) for h in layout.pp_hops), default=0.0
        )
        + (0.0 if sp or run.pp == 1 else ag),
        tp_ar_s=ar,
        tp_ag_s=te_ag if sp else ag,
        tp_rs_s=rs,
        tp_moe_s=tp_moe,
        tp_pairs=pairs,
        cp_fw_s=cp_fw,
        cp_bw_s=cp_bw,
    )


def _cp_blocking_s(inputs: SimInputs, layout: Layout, kv_bytes: float) -> tuple[float, float]:
    """Forward and backward seconds of one layer's blocking CP collectives over the CP group
    (`context_parallel.blocking_collectives`; 0.0 for the p2p ring). ``kv_bytes``: the whole
    sequence's K and V on one TP rank."""
    run, m, cl = layout.run, inputs.model, inputs.cluster
    q_bytes = kv_bytes / run.cp * m.num_heads / (2 * m.kv_heads)
    fw, bw = blocking_collectives(run.cp_comm_type, run.cp, q_bytes, kv_bytes / run.cp)
    group = layout.cp_group
    return (
        sum(collective_s(op, nbytes, group, cl) for op, nbytes in fw),
        sum(collective_s(op, nbytes, group, cl) for op, nbytes in bw),
    )


def _ring_step_s(nbytes: float, ring: Sequence[int], cl: Cluster) -> float:
    """One CP ring step: every rank sends ``nbytes`` to the next at once, so the slowest hop
    sets it; 0.0 for a ring of one rank."""
    if len(ring) < 2:
        return 0.0
    hops = ((a, ring[(i + 1) % len(ring)]) for i, a in enumerate(ring))
    return max((collective_s("send-recv", nbytes, h, cl) for h in hops), default=0.0)


def _tp_moe_s(inputs: SimInputs, layout: Layout, a: float) -> float:
    """A MoE layer's expert half, one direction: the dispatcher's TP all-gather and
    reduce-scatter of the ``k * A`` routed tokens; 0.0 for a dense model, and without sequence
    parallelism (MoE with tp > 1 runs under it only: `parallel.check_run`)."""
    m, g, cl = inputs.model, layout.tp_group, inputs.cluster
    if not (m.num_experts > 1 and layout.run.sequence_parallel):
        return 0.0
    ka = a * m.experts_per_token * routed_share(inputs, layout)  # the rows it gathers
    return collective_s("all-gather", ka, g, cl) + collective_s("reduce-scatter", ka, g, cl)


def _ep_s(inputs: SimInputs, layout: Layout, a: float) -> float:
    """A MoE layer's two all-to-alls over the EP group, one direction; 0.0 for a dense model."""
    m, run = inputs.model, layout.run
    if m.num_experts <= 1:
        return 0.0
    # each TP rank dispatches its own s/tp tokens under sequence parallelism (Megatron-core's
    # all-to-all dispatcher: num_local_tokens = s/tp x b), its expert shard then gathering them
    a2a = a * m.experts_per_token * routed_share(inputs, layout)
    a2a /= run.tp if run.sequence_parallel else 1
    return 2 * collective_s("all-to-all", a2a, layout.ep_group, inputs.cluster)


def routed_share(inputs: SimInputs, layout: Layout) -> float:
    """Share of a rank's ``tokens x experts_per_token`` routed rows that its experts run and
    its dispatcher moves: 1, or under an ``expert_capacity`` that binds what the cap keeps
    (Megatron-core's all-to-all dispatcher with a capacity factor and no padding permutes and
    sends ``num_out_tokens``, the kept rows; `ModelSpec.routed_rows` of the shard, whose cap
    `stagecost.shard_model` scales to the rank's ``s / cp``: `ModelSpec.routed_share`); the
    same share of the routed rows the experts save activations for (`dist_memory`)."""
    run = layout.run
    tokens = run.micro_batch_size * inputs.seq_len // run.cp
    return shard_model(inputs.model, run).routed_share(tokens, run.micro_batch_size)


def _dp_collective_s(
    op: Op, params: float, expert: float, itemsize: int, inputs: SimInputs, layout: Layout
) -> float:
    """One DP collective of ``params`` parameters: the dense ``params - expert`` over the
    dp x cp group, the ``expert`` ones over the expert-data-parallel group."""
    cl = inputs.cluster
    dense = collective_s(op, (params - expert) * itemsize, layout.dp_group, cl)
    return dense + collective_s(op, expert * itemsize, layout.edp_group, cl)


def dp_grad_s(params: float, inputs: SimInputs, layout: Layout, expert: float = 0.0) -> float:
    """Reduce one chunk's gradients over DP (all-reduce, or reduce-scatter when sharded);
    ``expert`` of the ``params`` over the expert-data-parallel group."""
    op: Op = "reduce-scatter" if layout.run.shards_optimizer else "all-reduce"
    return _dp_collective_s(op, params, expert, grad_itemsize_bytes(inputs.dtype), inputs, layout)


def dp_param_gather_s(
    params: float, inputs: SimInputs, layout: Layout, expert: float = 0.0
) -> float:
    """All-gather of updated (ZeRO-1/2, distributed optimizer) or needed (ZeRO-3) weights;
    ``expert`` of the ``params`` over the expert-data-parallel group."""
    itemsize = param_itemsize_bytes(inputs.dtype)
    return _dp_collective_s("all-gather", params, expert, itemsize, inputs, layout)


# DeepSpeed ZeRO-3 as Narayanan et al. (2021) ran it reached this fraction of the speed
# `topologies` models for NCCL's ring collectives (what its hooks lose besides the wire: tiny
# prefetch buckets, per-tensor launches, allocator churn). Fitted on the development set's three
# GPT-3 175B ZeRO-3 rows only (384-1536 A100s: errors -3.5, -0.4, +1.1% at the fit; -3.8,
# -0.6, +0.9% since the session-6 dropout/mask rules); the three 530B rows, left out of the
# fit, land at +8.9, +1.9, +11.7% (`tilesim validate distributed`).
DEEPSPEED_2021_ZERO3_EFFICIENCY = 0.445


def grad_buckets(layout: Layout) -> int:
    """Collectives one chunk's gradient reduction runs as: ``buckets`` with
    ``overlap_grad_reduce``, else one (Megatron-LM then sets no bucket size)."""
    return layout.run.buckets if layout.run.overlap_grad_reduce else 1


def param_gather_buckets(layout: Layout) -> int:
    """Buckets a stage's updated weights are all-gathered in with ``overlap_param_gather``: one
    chunk's ``buckets`` over every chunk of the stage. Without ``overlap_grad_reduce`` there is
    one bucket (Megatron-LM has none then, and refuses --overlap-param-gather)."""
    return grad_buckets(layout) * layout.chunks if layout.run.overlap_param_gather else 1


def grad_sync_s(params: float, inputs: SimInputs, layout: Layout, expert: float = 0.0) -> float:
    """One chunk's gradient reduction as it runs: `grad_buckets` collectives of an equal share
    of the gradients each (every bucket pays its own launch and latency; ``expert`` of the
    ``params`` are a bucket of their own group's in each)."""
    n = grad_buckets(layout)
    return n * dp_grad_s(params / n, inputs, layout, expert / n)


def param_gather_exposed_s(
    params: float, inputs: SimInputs, layout: Layout, expert: float = 0.0
) -> float:
    """The part of the sharded optimizer's all-gather of a stage's updated weights (``params``,
    ``expert`` of them expert weights) that the step waits for: all of it, or with
    ``overlap_param_gather`` (Megatron-LM's ``--overlap-param-gather``: bucket by bucket under
    the next forward) the first bucket's all-gather, one of `param_gather_buckets`."""
    n = param_gather_buckets(layout)
    return dp_param_gather_s(params / n, inputs, layout, expert / n)


def zero3_blocking_s(
    inputs: SimInputs,
    layout: Layout,
    layers: int,
    *,
    first: bool,
    last: bool,
    memo: dict[tuple[Op, float, bool], float] | None = None,
) -> tuple[float, float]:
    """Seconds of ZeRO-3 collectives one chunk's forward and backward wait for, per micro-batch,
    under ``zero3_impl = "deepspeed-2021"``: module hooks all-gather each parameter tensor when
    its module runs (again for the recomputed forward under full recompute) and reduce-scatter
    each gradient after it, all on the compute stream's critical path. ``memo`` keeps each
    tensor's collective time across calls over the same groups (every chunk of a layout).
    Every tensor moves over the dp x cp group but a MoE layer's experts', which move over the
    dp x cp / ep ranks holding the same experts (`Layout.edp_group`; DeepSpeed-MoE's expert
    data-parallel group; nothing at ep = dp x cp). They moved over dp x cp, ranks holding
    other experts among them (DeepSpeed's 2021 runs, which the efficiency is fitted on, had no
    experts)."""
    m, run, cl = inputs.model, layout.run, inputs.cluster
    pb, gb = param_itemsize_bytes(inputs.dtype), grad_itemsize_bytes(inputs.dtype)
    memo = {} if memo is None else memo

    def cost(op: Op, tensors: Sequence[float], itemsize: int, *, expert: bool = False) -> float:
        group = layout.edp_group if expert else layout.dp_group
        if len(group) < 2:
            return 0.0
        total = 0.0
        for t in tensors:
            if (op, t, expert) not in memo:  # NCCL's only all-gather/reduce-scatter then: ring
                memo[op, t, expert] = collective_time_s(
                    op, t * itemsize, group, cl, algorithm="ring"
                )
            total += memo[op, t, expert]
        return total

    def layer_s(op: Op, itemsize: int) -> float:
        dense = m.layer_param_tensors(moe=False, tp=run.tp, ep=run.ep)
        shared = m.layer_param_tensors(moe=True, tp=run.tp, ep=run.ep, experts=False)
        experts = m.expert_param_tensors(tp=run.tp, ep=run.ep)
        moe_s = cost(op, shared, itemsize) + cost(op, experts, itemsize, expert=True)
        return (layers - moe) * cost(op, dense, itemsize) + (moe * moe_s if moe else 0.0)

    moe = m.moe_layers(layers)
    ends = end_tensors(m, run, first=first, last=last)
    gather = layer_s("all-gather", pb) + cost("all-gather", ends, pb)
    scatter = layer_s("reduce-scatter", gb) + cost("reduce-scatter", ends, gb)
    regather = 2 if run.recompute == "full" else 1
    eff = DEEPSPEED_2021_ZERO3_EFFICIENCY
    return gather / eff, (regather * gather + scatter) / eff
