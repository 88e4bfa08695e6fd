"""Per-layer communication of one micro-batch: what each TP, CP, EP and PP collective moves,
priced by `topologies` (the DP collectives are `dp_comm`'s).

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
  parallelism the activation is already split over TP and nothing is gathered). A hop that
  leaves a leaf of an oversubscribed fat tree shares the uplinks with the rest of its stage's
  boundary: it is slowed by the share of the leaf's pipeline sends that leave it times the
  ratio (`Cluster.p2p_spine`), not by the full ratio its two ranks alone would give.
* DP (gradient reductions, parameter gathers, ZeRO-3): `dp_comm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from forecast.kernels import ITEMSIZE_BYTES
from simulator import moe_routing
from simulator.context_parallel import blocking_collectives
from simulator.memory import activation_itemsize_bytes
from simulator.opgraph import te_fp8
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.stagecost import shard_model
from topologies import Cluster, collective_estimate
from topologies.algorithms import Op
from topologies.spine import SpineSlowdown, ring_step_share, shift_share


def collective_s(
    op: Op,
    nbytes: float,
    ranks: Sequence[int],
    cluster: Cluster,
    spine: SpineSlowdown | None = None,
) -> float:
    """Seconds for one collective; 0 for a group of one rank or no data (``spine``: see
    `topologies.collective_estimate`)."""
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    return collective_estimate(op, nbytes, ranks, cluster, spine=spine).time_s


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
    run, cl = layout.run, inputs.cluster
    a = activation_bytes(inputs, layout)
    tp = _tp_collectives(inputs, layout, a)
    sp = run.sequence_parallel
    tp_one = tp.te_ag + tp.rs if sp else tp.ar
    tp_moe = _tp_moe_s(inputs, layout, a)
    moe = inputs.model.num_experts > 1  # every layer (`ModelSpec.moe_every` > 1 is Switch only)
    pairs = 1 if moe else 2  # linear pairs moving ``A``: attention (and a dense MLP)
    kv_bytes = _kv_bytes(inputs, layout)
    ring = kv_bytes if run.cp_comm_type == "p2p" else 0.0
    cp_fw, cp_bw = _cp_blocking_s(inputs, layout, kv_bytes)
    ep = _ep_s(inputs, layout, a)
    return LayerComm(
        tp_fw_s=pairs * tp_one + tp_moe,
        tp_bw_s=pairs * (tp_one + tp.te_ag) + tp_moe,
        tp_embed_fw_s=tp.rs if sp else tp.ar,
        tp_embed_bw_s=tp.ag if sp else 0.0,
        tp_head_fw_s=tp.ag if sp else 0.0,
        tp_head_bw_s=tp.rs if sp else tp.ar,
        cp_kv_s=_ring_step_s(ring / run.cp, layout, cl),
        cp_kv_grad_s=_ring_step_s(2 * ring / run.cp, layout, cl),
        ep_fw_s=ep,
        ep_bw_s=ep,
        pp_hop_s=_pp_hop_s(inputs, layout, a, tp.ag),
        tp_ar_s=tp.ar,
        tp_ag_s=tp.te_ag if sp else tp.ag,
        tp_rs_s=tp.rs,
        tp_moe_s=tp_moe,
        tp_pairs=pairs,
        cp_fw_s=cp_fw,
        cp_bw_s=cp_bw,
    )


@dataclass(frozen=True, slots=True)
class _TpCollectives:
    """One TP collective of each kind a layer runs, seconds; 0.0 for those its layout runs
    none of (``ar`` under sequence parallelism, ``te_ag`` and ``rs`` without it)."""

    ag: float  # all-gather of ``A``: Megatron's own (head, embedding, PP hop)
    te_ag: float  # the layer's linears' all-gather (TransformerEngine's: `te_gather_bytes`)
    ar: float  # all-reduce of ``A``
    rs: float  # reduce-scatter of ``A``


def _tp_collectives(inputs: SimInputs, layout: Layout, a: float) -> _TpCollectives:
    """The TP group's collectives of ``a`` bytes (``A``) under this layout."""
    g, cl, sp = layout.tp_group, inputs.cluster, layout.run.sequence_parallel
    return _TpCollectives(
        ag=collective_s("all-gather", a, g, cl),
        te_ag=collective_s("all-gather", te_gather_bytes(inputs, layout), g, cl) if sp else 0.0,
        ar=0.0 if sp else collective_s("all-reduce", a, g, cl),
        rs=collective_s("reduce-scatter", a, g, cl) if sp else 0.0,
    )


def _kv_bytes(inputs: SimInputs, layout: Layout) -> float:
    """The whole sequence's K and V of one micro-batch on one TP rank (bf16 under fp8)."""
    run, m = layout.run, inputs.model
    kv = 2 * run.micro_batch_size * inputs.seq_len * m.kv_heads * m.dhead / run.tp
    return kv * activation_itemsize_bytes(inputs.dtype, inputs.framework)


def _pp_hop_s(inputs: SimInputs, layout: Layout, a: float, ag: float) -> float:
    """One stage boundary's send-recv of ``a / tp`` bytes (its slowest hop), plus the receiving
    TP group's all-gather ``ag`` of ``A`` without sequence parallelism."""
    run, cl = layout.run, inputs.cluster
    stride = layout.stage_ranks  # every rank of a stage sends across at once
    spine = cl.p2p_spine(shift_share, run.pp * stride, stride, run.virtual_stages > 1)
    hop = max(
        (collective_s("send-recv", a / run.tp, h, cl, spine) for h in layout.pp_hops), default=0.0
    )
    return hop + (0.0 if run.sequence_parallel or run.pp == 1 else ag)


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


def _ring_step_s(nbytes: float, layout: Layout, cl: Cluster) -> float:
    """One CP ring step: every rank sends ``nbytes`` to the next at once, so the slowest hop
    of the priced CP group sets it; 0.0 for a ring of one rank. Every CP ring steps together,
    so one crossing a leaf shares the uplinks with all of them (`Cluster.p2p_spine`)."""
    ring, run = layout.cp_group, layout.run
    if len(ring) < 2:
        return 0.0
    spine = cl.p2p_spine(ring_step_share, layout.stage_ranks * run.pp, run.tp, run.cp)
    hops = ((a, ring[(i + 1) % len(ring)]) for i, a in enumerate(ring))
    return max((collective_s("send-recv", nbytes, h, cl, spine) for h in hops), default=0.0)


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
    sends ``num_out_tokens``, the kept rows; `moe_routing.routed_rows` of the shard, whose cap
    `stagecost.shard_model` scales to the rank's ``s / cp``: `moe_routing.routed_share`); the
    same share of the routed rows the experts save activations for (`dist_memory`)."""
    run = layout.run
    tokens = run.micro_batch_size * inputs.seq_len // run.cp
    return moe_routing.routed_share(shard_model(inputs.model, run), tokens, run.micro_batch_size)
