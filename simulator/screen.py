"""The closed-form screen: step time and memory of a layout in tens of microseconds.

Same inputs as `simulate` (kernel table, `topologies` collective costs, `dist_memory`), but
no execution graph. With ``T`` the slowest stage's time for one micro-batch through all its
chunks (layer forward + backward + recompute + exposed TP/EP/CP communication, as `stepcosts`
prices it, plus the
embedding and head on the stages that hold them), ``m`` micro-batches and ``v`` chunks:

    forward-backward = T * (m + (pp - 1) / v) + 2 * hops * hop_s

i.e. the GPipe/1F1B bubble ``(p-1)/(m+p-1)`` (``/v`` interleaved), with ``hops`` the
point-to-point transfers on the critical path (`pipeline_forms.pipeline_hops`: fill and
drain, plus 1F1B's steady-state round trips); where interleaving's sends outlast a chunk's
forward or backward, the cycles they close pace the steady state instead
(`pipeline_forms.send_paced_s`). GPipe runs all forwards, then all backwards: each phase
paced by its own slowest stage (`pipeline_forms.forward_backward_s`). The DP gradient reduction
(expert gradients over their expert-data-parallel group, as `dp_comm` prices them) of each stage
hides, all but its last bucket, behind the last backward when it overlaps;
the sharded optimizer's parameter all-gather, sequence parallelism's norm-gradient all-reduce
over TP and the optimizer step are added per stage, the slowest stage's tail counting, and a tied
embedding's gradient all-reduce between the first and the last stage (`finalize_grads`). ZeRO-3's
gathers and scatters share one stream that hides under compute but for its first gather and
last scatter, or sets the pace (`_with_zero3_s`), and so do ZeRO-2's scatters after every
backward when it accumulates over micro-batches; ``deepspeed-2021`` ZeRO-3 blocks each
micro-batch on them (`dp_comm.zero3_blocking_s`). Memory is `dist_memory`'s, with
the schedule's in-flight micro-batches in closed form (`pipeline_forms.in_flight_closed`).

Kernel block times and collective costs repeat across layouts: `screen_cache.ScreenCache`
memoises them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.dist_memory import MemoryBreakdown, stage_memory
from simulator.dp_comm import grad_buckets, param_gather_buckets, zero3_blocking_s
from simulator.memory import grad_itemsize_bytes, param_itemsize_bytes
from simulator.parallel import Layout, RunConfig
from simulator.pipeline_forms import forward_backward_s, in_flight_closed, pipeline_sends_s
from simulator.screen_cache import ScreenCache
from simulator.simulate import layout_of
from simulator.stepcosts import (
    cp_bw_exposed_s,
    cp_fw_exposed_s,
    optimizer_params,
    scatters_every_backward,
    tp_bw_exposed_s,
)


@dataclass(frozen=True, slots=True)
class Screened:
    """The screen's estimate for one layout."""

    iteration_s: float
    tokens_per_s: float
    memory: MemoryBreakdown


def _stage_parts_s(cache: ScreenCache, layout: Layout) -> list[tuple[float, float]]:
    """Seconds of one micro-batch's forward and backward through every chunk of each stage
    (recompute and its collectives in the backward, as `stepcosts` prices them)."""
    run = layout.run
    bt, lc = cache.block(run), cache.layer(layout)
    full = run.recompute == "full"
    redo = {"none": 0.0, "selective": bt.attention_fw_s, "full": bt.layer_fw_s}[run.recompute]
    cp_fw = cp_fw_exposed_s(run.cp, lc, bt.ring)  # again when the attention is recomputed
    fw = bt.layer_fw_s + lc.tp_fw_s + lc.ep_fw_s + cp_fw
    bw = bt.layer_bw_s + redo + tp_bw_exposed_s(bt, lc, run) + lc.ep_bw_s
    bw += (lc.tp_fw_s + lc.ep_fw_s) if full else 0.0
    bw += cp_fw * (1 if run.recompute != "none" else 0)
    bw += cp_bw_exposed_s(run.cp, lc, bt.ring)
    pp, v = run.pp, layout.chunks
    out = []
    for s in range(pp):
        n = sum(layout.layers_per_stage[s])
        f, b = n * fw, n * bw
        if s == 0:
            f += bt.embed_fw_s + lc.tp_embed_fw_s
            b += bt.embed_bw_s + lc.tp_embed_bw_s
        if (pp * v - 1) % pp == s:
            f += bt.head_fw_s + lc.tp_head_fw_s
            b += bt.head_bw_s + lc.tp_head_bw_s
        out.append((f, b))
    return out


def _stage_mb_s(cache: ScreenCache, layout: Layout) -> list[float]:
    """Seconds of one micro-batch through every chunk of each stage."""
    return [f + b for f, b in _stage_parts_s(cache, layout)]


def _plus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def _zero3_gather_scatter_s(
    cache: ScreenCache, layout: Layout, params: tuple[float, float]
) -> tuple[float, float]:
    """One chunk's ZeRO-3 parameter all-gather and gradient reduce-scatter (of ``1 / chunks``
    of the stage's ``params``, total and expert)."""
    dtype, v = cache.inputs.dtype, layout.chunks
    gather = cache.dp_both("all-gather", params, param_itemsize_bytes(dtype), v, layout)
    scatter = cache.dp_both("reduce-scatter", params, grad_itemsize_bytes(dtype), v, layout)
    return gather, scatter


def _with_zero3_s(
    cache: ScreenCache, layout: Layout, params: list[tuple[float, float]], fb: float
) -> float:
    """The forward-backward span ``fb`` with ZeRO-3 (``fsdp``): its stream gathers before
    each forward and backward of every chunk and reduce-scatters after each backward, one
    stream sharing the links (as in the execution graph); it hides under compute but for the
    first gather and the last scatter, or sets the pace when it is the busier. ZeRO-2
    accumulating over micro-batches runs the scatters alone (`scatters_every_backward`)."""
    zero2 = scatters_every_backward(layout)  # ZeRO-2's reduce-scatters alone
    if (layout.run.zero_stage < 3 and not zero2) or layout.run.zero3_blocks:
        return fb
    ends = [_zero3_gather_scatter_s(cache, layout, p) for p in params]
    if zero2:
        ends = [(0.0, r) for _, r in ends]
    stream = layout.num_micro_batches * layout.chunks * max(2 * g + r for g, r in ends)
    return max(fb + max(g + r for g, r in ends), stream)


def _dp_s(
    cache: ScreenCache, layout: Layout, params: tuple[float, float], backward_s: float
) -> float:
    """Exposed DP communication of a stage holding ``params`` (total, expert) parameters; with
    overlap, the reduction of all but the last bucket hides behind the last backward
    (``backward_s``)."""
    run, dtype = layout.run, cache.inputs.dtype
    gb, pb = grad_itemsize_bytes(dtype), param_itemsize_bytes(dtype)
    if run.zero3_blocks:
        return 0.0  # on the compute stream: `_zero3_blocking_s`
    if run.zero_stage >= 3:
        return 0.0  # in the forward-backward span: `_with_zero3_s`
    exposed = 0.0  # ZeRO-2 accumulating: reduced after every backward, `_with_zero3_s`
    if not scatters_every_backward(layout):
        op = "reduce-scatter" if run.shards_optimizer else "all-reduce"
        n = layout.chunks * grad_buckets(layout)  # as `dp_comm.grad_sync_s`, over every chunk
        grad = n * cache.dp_both(op, params, gb, n, layout)
        overlap = run.overlap_grad_reduce
        exposed = grad - (min(grad, backward_s) * (1 - 1 / run.buckets) if overlap else 0.0)
    if run.shards_optimizer:  # as `dp_comm.param_gather_exposed_s`
        k = param_gather_buckets(layout)
        exposed += cache.dp_both("all-gather", params, pb, k, layout)
    return exposed


def _zero3_blocking_s(cache: ScreenCache, layout: Layout, s: int) -> tuple[float, float]:
    """Blocking ZeRO-3 collectives (deepspeed-2021) of one micro-batch's forward and backward
    through stage ``s``."""
    r = layout.run
    memo = cache.zero3.setdefault((r.tp, r.cp, r.ep, layout.dp), {})  # per DP group
    pp, v = r.pp, layout.chunks
    fw_s = bw_s = 0.0
    for c, layers in enumerate(layout.layers_per_stage[s]):
        vs = c * pp + s
        first, last = vs == 0, vs == pp * v - 1
        fw, bw = zero3_blocking_s(cache.inputs, layout, layers, first=first, last=last, memo=memo)
        fw_s += fw
        bw_s += bw
    return fw_s, bw_s


def _memory(cache: ScreenCache, layout: Layout, params: list[float]) -> MemoryBreakdown:
    """The fullest stage. Stages with the same layers and ends hold the same weights, and the
    in-flight count never grows with the stage index, so the first of each such group is the
    fullest of it: only those are priced (the same answer as pricing every stage)."""
    run, m, v = layout.run, layout.num_micro_batches, layout.chunks
    first_of: dict[tuple[Any, ...], int] = {}
    for s in range(run.pp):
        first_of.setdefault((layout.layers_per_stage[s], s == 0, s == run.pp - 1), s)
    stages = [
        stage_memory(
            cache.inputs, layout, s, params[s], in_flight_closed(run.schedule, run.pp, m, v, s)
        )
        for s in sorted(first_of.values())
    ]
    return max(stages, key=lambda x: x.total_bytes)


def screen(cache: ScreenCache, run: RunConfig) -> Screened:
    """Closed-form step time, throughput and peak memory of one layout."""
    inputs = cache.inputs
    layout = layout_of(inputs, run)
    lc = cache.layer(layout)
    parts = _stage_parts_s(cache, layout)
    m, v, pp = layout.num_micro_batches, layout.chunks, run.pp
    params = cache.stage_params(layout)
    if run.zero3_blocks:
        parts = [_plus(fb, _zero3_blocking_s(cache, layout, s)) for s, fb in enumerate(parts)]
    if run.pp_blocking_sends and pp > 1:  # each chunk's forward and backward wait on a send
        parts = [_plus(fb, (v * lc.pp_hop_s, v * lc.pp_hop_s)) for fb in parts]
    fb = _with_zero3_s(cache, layout, params, forward_backward_s(run.schedule, parts, m, v))
    fb += pipeline_sends_s(run.schedule, parts, m, v, lc.pp_hop_s)
    adam = cache.block(run).adam_s_per_param
    last_bw = min(b for _, b in parts) / v
    # per stage: its DP reduction, its norms' TP all-reduce (sequence parallelism), its update
    tail = max(
        _dp_s(cache, layout, p, last_bw) + norm + optimizer_params(*p, layout) * adam
        for p, norm in set(zip(params, cache.norm_sync(layout), strict=True))
    )
    # the tied embedding's all-reduce between the first and last stage, before their updates
    iteration = fb + tail + cache.embedding_sync(layout)
    return Screened(
        iteration_s=iteration,
        tokens_per_s=inputs.global_batch_size * inputs.seq_len / iteration,
        memory=_memory(cache, layout, [p for p, _ in params]),
    )
