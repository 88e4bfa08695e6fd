"""Assemble `StepCosts` (plain seconds per chunk) from block times and communication.

Per chunk of ``n`` layers and one micro-batch: forward = ``n`` layer forwards (+ embedding on
the first virtual stage, + head on the last); backward = ``n`` layer backwards + recompute
(full: the layer forward again, with its TP, EP and CP collectives; selective: the attention
core, with its CP ring).

Backward TP communication per layer (two column-parallel linears, attention and MLP): blocking,
2 all-reduces (or 2 x all-gather + reduce-scatter with sequence parallelism); with
``tp_comm_overlap`` (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication``) each
linear's all-reduce runs while its weight-gradient GEMM does, so only the excess is exposed;
with sequence parallelism the row-parallel linears' all-gathers still block, and each
column-parallel linear re-gathers its input under its input-gradient GEMM and reduce-scatters
its input gradient under its weight-gradient GEMM. A MoE layer's experts gather and scatter
their routed tokens in the token dispatcher, blocking (`comm` module docstring).
"""

from __future__ import annotations

from dataclasses import replace

from forecast.predict import LatencyTable
from simulator.comm import LayerComm, layer_comm
from simulator.context_parallel import RingTimes, bw_exposed_s, fw_exposed_s
from simulator.dp_comm import (
    dp_grad_s,
    dp_param_gather_s,
    grad_sync_s,
    param_gather_exposed_s,
    zero3_blocking_s,
)
from simulator.finalize_grads import embedding_grad_sync_s, norm_grad_sync_s
from simulator.parallel import Layout, RunConfig
from simulator.scenario import SimInputs
from simulator.shard_params import chunk_expert_params, chunk_params
from simulator.stagecost import BlockTimes, block_times, shard_kernels
from simulator.task_costs import ChunkCost, StepCosts
from topologies.algorithms import Op


def tp_bw_exposed_s(bt: BlockTimes, lc: LayerComm, run: RunConfig) -> float:
    """Exposed backward TP communication of one layer (module docstring)."""
    if not run.tp_comm_overlap or run.tp == 1 or not bt.col_wgrad_s:
        return lc.tp_bw_s
    pairs = zip(bt.col_dgrad_s, bt.col_wgrad_s, strict=True)
    # a MoE layer's expert collectives (`LayerComm.tp_moe_s`) block: its expert linears run
    # no collective of their own (Megatron-core's explicit_expert_comm)
    if run.sequence_parallel:
        hidden = sum(max(0.0, lc.tp_ag_s - d) + max(0.0, lc.tp_rs_s - w) for d, w in pairs)
        return lc.tp_pairs * lc.tp_ag_s + hidden + lc.tp_moe_s
    return sum(max(0.0, lc.tp_ar_s - w) for _, w in pairs) + lc.tp_moe_s


def cp_fw_exposed_s(cp: int, lc: LayerComm, ring: RingTimes) -> float:
    """Exposed forward CP communication of one layer: the ring's sends past their steps'
    attention (`context_parallel.fw_exposed_s`), or the collectives that block it."""
    return fw_exposed_s(cp, lc.cp_kv_s, ring) + lc.cp_fw_s


def cp_bw_exposed_s(cp: int, lc: LayerComm, ring: RingTimes) -> float:
    """Exposed backward CP communication of one layer: the ring's sends past their steps'
    attention (`context_parallel.bw_exposed_s`), or the collectives that block it."""
    return bw_exposed_s(cp, lc.cp_kv_s, lc.cp_kv_grad_s, ring) + lc.cp_bw_s


def _chunk_cost(
    bt: BlockTimes, lc: LayerComm, layout: Layout, layers: int, ends: tuple[bool, bool]
) -> ChunkCost:
    first, last = ends
    run = layout.run
    recompute = {"none": 0.0, "selective": bt.attention_fw_s, "full": bt.layer_fw_s}[run.recompute]
    full = run.recompute == "full"
    fw = (
        layers * bt.layer_fw_s + (bt.embed_fw_s if first else 0.0) + (bt.head_fw_s if last else 0.0)
    )
    bw = layers * (bt.layer_bw_s + recompute)
    bw += (bt.embed_bw_s if first else 0.0) + (bt.head_bw_s if last else 0.0)
    cp_fw_exposed = cp_fw_exposed_s(run.cp, lc, bt.ring)
    # a recomputed attention core (selective or full) runs its forward ring again
    cp_redo = cp_fw_exposed if run.recompute != "none" else 0.0
    return ChunkCost(
        fw_compute_s=fw,
        bw_compute_s=bw,
        fw_tp_s=layers * lc.tp_fw_s + _ends(first, last, lc.tp_embed_fw_s, lc.tp_head_fw_s),
        bw_tp_s=layers * (tp_bw_exposed_s(bt, lc, run) + (lc.tp_fw_s if full else 0.0))
        + _ends(first, last, lc.tp_embed_bw_s, lc.tp_head_bw_s),
        fw_ep_s=layers * lc.ep_fw_s,
        bw_ep_s=layers * (lc.ep_bw_s + (lc.ep_fw_s if full else 0.0)),
        fw_cp_s=layers * cp_fw_exposed,
        bw_cp_s=layers * (cp_bw_exposed_s(run.cp, lc, bt.ring) + cp_redo),
    )


def _ends(first: bool, last: bool, embed_s: float, head_s: float) -> float:
    """The embedding's part on the first chunk, the output layer's on the last."""
    return (embed_s if first else 0.0) + (head_s if last else 0.0)


def _with_dp(
    c: ChunkCost,
    params: tuple[float, float],
    inputs: SimInputs,
    layout: Layout,
    layers: int,
    ends: tuple[bool, bool],
    memo: dict[tuple[Op, float, bool], float],
) -> ChunkCost:
    """``params``: the chunk's parameters and how many of them are expert parameters."""
    total, expert = params
    if layout.run.zero3_blocks:
        fw, bw = zero3_blocking_s(inputs, layout, layers, first=ends[0], last=ends[1], memo=memo)
        return replace(c, fw_dp_s=fw, bw_dp_s=bw)
    if layout.run.zero_stage >= 3:
        gather = dp_param_gather_s(total, inputs, layout, expert)
        scatter = dp_grad_s(total, inputs, layout, expert)
        return replace(c, zero3_gather_s=gather, zero3_scatter_s=scatter)
    if scatters_every_backward(layout):
        return replace(c, zero3_scatter_s=dp_grad_s(total, inputs, layout, expert))
    return replace(c, grad_sync_s=grad_sync_s(total, inputs, layout, expert))


def scatters_every_backward(layout: Layout) -> bool:
    """ZeRO-2 accumulating over micro-batches: a rank keeps only its 1/dp share of the
    gradients (`dist_memory`), so each backward's gradients are reduce-scattered before the
    next micro-batch adds to them (DeepSpeed's stage 2, FSDP's SHARD_GRAD_OP), not once a step
    as ZeRO-1 reduces its full gradient buffer."""
    return layout.run.zero_stage == 2 and layout.num_micro_batches > 1


def step_costs(inputs: SimInputs, layout: Layout, table: LatencyTable) -> StepCosts:
    """Seconds per chunk, hop, optimizer and parameter gather for one layout."""
    run = layout.run
    bt = block_times(shard_kernels(inputs, run), table, run)
    lc = layer_comm(inputs, layout)
    pp = run.pp
    chunks, optimizer, gather = [], [], []
    zero3_memo: dict[tuple[Op, float, bool], float] = {}  # one layout: every chunk shares it
    for s in range(pp):
        row, stage_params, stage_expert = _stage_chunks(inputs, layout, s, (bt, lc), zero3_memo)
        chunks.append(row)
        local = optimizer_params(stage_params, stage_expert, layout)
        optimizer.append(local * bt.adam_s_per_param)
        sharded = run.shards_optimizer and run.zero_stage < 3
        exposed = (
            param_gather_exposed_s(stage_params, inputs, layout, stage_expert) if sharded else 0.0
        )
        gather.append(exposed)
    return StepCosts(
        chunks=tuple(chunks),
        num_micro_batches=layout.num_micro_batches,
        schedule=run.schedule,
        pp_hop_s=lc.pp_hop_s,
        optimizer_s=tuple(optimizer),
        param_gather_s=tuple(gather),
        overlap_grad_reduce=run.overlap_grad_reduce,
        buckets=run.buckets,
        blocking_sends=run.pp_blocking_sends and pp > 1,
        embedding_sync_s=embedding_grad_sync_s(inputs, layout),
        norm_sync_s=norm_grad_sync_s(inputs, layout),
    )


def _stage_chunks(
    inputs: SimInputs,
    layout: Layout,
    s: int,
    prices: tuple[BlockTimes, LayerComm],
    memo: dict[tuple[Op, float, bool], float],
) -> tuple[tuple[ChunkCost, ...], float, float]:
    """Stage ``s``'s chunk costs, DP communication included, and the parameters one GPU of
    it holds (total, expert), summed over its chunks; ``memo`` prices ZeRO-3 collectives."""
    run, pp, v = layout.run, layout.run.pp, layout.chunks
    row, stage_params, stage_expert = [], 0.0, 0.0
    for c in range(v):
        vs = c * pp + s
        n = layout.layers_per_stage[s][c]
        ends = (vs == 0, vs == pp * v - 1)
        params = chunk_params(inputs.model, run, n, first=ends[0], last=ends[1])
        expert = chunk_expert_params(inputs.model, run, n)
        stage_params += params
        stage_expert += expert
        cost = _chunk_cost(*prices, layout, n, ends)
        row.append(_with_dp(cost, (params, expert), inputs, layout, n, ends, memo))
    return tuple(row), stage_params, stage_expert


def optimizer_params(params: float, expert: float, layout: Layout) -> float:
    """Parameters whose optimizer state one GPU steps, of the ``params`` (``expert`` of them
    expert parameters) it holds: its share when the optimizer is sharded (`Layout.sharded`)."""
    return layout.sharded(params, expert) if layout.run.shards_optimizer else params


def stage_params(inputs: SimInputs, layout: Layout) -> list[float]:
    """Parameters one GPU of each stage holds."""
    run, pp, v = layout.run, layout.run.pp, layout.chunks
    out = []
    for s in range(pp):
        total = 0.0
        for c in range(v):
            vs = c * pp + s
            n = layout.layers_per_stage[s][c]
            total += chunk_params(inputs.model, run, n, first=vs == 0, last=vs == pp * v - 1)
        out.append(total)
    return out


def stage_expert_params(inputs: SimInputs, layout: Layout) -> list[float]:
    """Expert parameters one GPU of each stage holds (part of `stage_params`)."""
    run = layout.run
    return [
        sum(chunk_expert_params(inputs.model, run, n) for n in layout.layers_per_stage[s])
        for s in range(run.pp)
    ]
