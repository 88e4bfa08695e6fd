"""The closed-form screen: step time and memory of a layout in tens of microseconds.

Same inputs as `simulate` (kernel table, `topologies` collective costs, `dist_memory`), but
no execution graph. With ``T`` the slowest stage's time for one micro-batch through all its
chunks (layer forward + backward + recompute + exposed TP/EP/CP communication, as `stepcosts`
prices it, plus the
embedding and head on the stages that hold them), ``m`` micro-batches and ``v`` chunks:

    forward-backward = T * (m + (pp - 1) / v) + 2 * hops * hop_s

i.e. the GPipe/1F1B bubble ``(p-1)/(m+p-1)`` (``/v`` interleaved), with ``hops`` the
point-to-point transfers on the critical path (fill and drain, plus one round trip per
micro-batch in 1F1B's steady state, one way on average). The DP gradient reduction
(expert gradients over their expert-data-parallel group, as `comm` prices them) of each stage
hides, all but its last bucket, behind the last backward when it overlaps;
the sharded optimizer's parameter all-gather and the optimizer step are added. ZeRO-3 pays its
gathers and scatters unoverlapped (a pessimistic screen); ``deepspeed-2021`` ZeRO-3 blocks each
micro-batch on them (`comm.zero3_blocking_s`). Memory is `dist_memory`'s, with
the schedule's in-flight micro-batches in closed form (`in_flight_closed`).

Kernel block times and collective costs repeat across layouts, so `ScreenCache` memoises them
per shard shape and per (collective, bytes, group); a cache lives in one worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forecast.predict import LatencyTable
from simulator.comm import (
    LayerComm,
    collective_s,
    grad_buckets,
    layer_comm,
    param_gather_buckets,
    zero3_blocking_s,
)
from simulator.dist_memory import MemoryBreakdown, stage_memory
from simulator.memory import grad_itemsize_bytes, param_itemsize_bytes
from simulator.parallel import Layout, RunConfig
from simulator.scenario import SimInputs
from simulator.simulate import layout_of
from simulator.stagecost import BlockTimes, block_times, shard_kernels
from simulator.stepcosts import (
    optimizer_params,
    stage_expert_params,
    stage_params,
    tp_bw_exposed_s,
)


def in_flight_closed(schedule: str, pp: int, m: int, v: int, stage: int) -> int:
    """Micro-batch activations a stage holds at once (equals `schedules.in_flight`)."""
    if schedule == "gpipe":
        return m * v
    total = m * v
    later = pp - stage - 1
    warm = min(later, m) if v == 1 else min(later * 2 + (v - 1) * pp, total)
    return warm + 1 if total > warm else total


@dataclass
class ScreenCache:
    """Memoised block times and collective costs for one context (one worker's copy)."""

    inputs: SimInputs
    table: LatencyTable
    blocks: dict[tuple[Any, ...], BlockTimes] = field(default_factory=dict)
    comms: dict[tuple[Any, ...], LayerComm] = field(default_factory=dict)
    colls: dict[tuple[Any, ...], float] = field(default_factory=dict)
    params: dict[tuple[Any, ...], list[tuple[float, float]]] = field(default_factory=dict)
    zero3: dict[tuple[Any, ...], dict[Any, float]] = field(default_factory=dict)

    def block(self, run: RunConfig) -> BlockTimes:
        """Kernel seconds per block for this shard shape."""
        key = (run.tp, run.cp, run.ep, run.micro_batch_size, run.sequence_parallel)
        if key not in self.blocks:
            sk = shard_kernels(self.inputs, run)
            self.blocks[key] = block_times(sk, self.table, run)
        return self.blocks[key]

    def layer(self, layout: Layout) -> LayerComm:
        """Per-layer communication seconds for this shard shape and group placement."""
        r = layout.run
        # the shard shape, and where the hops and the groups priced lie
        shape = (r.tp, r.cp, r.ep, r.micro_batch_size, r.sequence_parallel)
        key = (*shape, layout.pp_hops, layout.cp_group[0], layout.ep_group[0])
        if key not in self.comms:
            self.comms[key] = layer_comm(self.inputs, layout)
        return self.comms[key]

    def stage_params(self, layout: Layout) -> list[tuple[float, float]]:
        """Parameters one GPU of each stage holds, and how many of them are expert parameters
        (`stepcosts.stage_params`, `stepcosts.stage_expert_params`)."""
        r = layout.run
        key = (r.tp, r.ep, layout.layers_per_stage)
        if key not in self.params:
            total = stage_params(self.inputs, layout)
            expert = stage_expert_params(self.inputs, layout)
            self.params[key] = list(zip(total, expert, strict=True))
        return self.params[key]

    def dp(self, op: str, nbytes: float, layout: Layout, *, expert: bool = False) -> float:
        """One collective over the layout's DP group (``expert``: its expert-data-parallel
        group, `Layout.edp_group`)."""
        r = layout.run
        group = layout.edp_group if expert else layout.dp_group
        key = (op, round(nbytes), r.tp, r.cp, layout.dp, r.ep if expert else 0, group[0])
        if key not in self.colls:
            self.colls[key] = collective_s(op, nbytes, group, self.inputs.cluster)  # type: ignore[arg-type]
        return self.colls[key]

    def dp_both(
        self, op: str, params: tuple[float, float], itemsize: int, parts: int, layout: Layout
    ) -> float:
        """One DP collective of ``1 / parts`` of ``params`` (total, expert) parameters of
        ``itemsize`` bytes: the dense ones over the DP group, the experts over theirs
        (`comm.dp_grad_s`)."""
        total, expert = params
        dense = self.dp(op, (total - expert) * itemsize / parts, layout)
        return dense + self.dp(op, expert * itemsize / parts, layout, expert=True)


@dataclass(frozen=True, slots=True)
class Screened:
    """The screen's estimate for one layout."""

    iteration_s: float
    tokens_per_s: float
    memory: MemoryBreakdown


def _stage_mb_s(cache: ScreenCache, layout: Layout) -> list[float]:
    """Seconds of one micro-batch through every chunk of each stage."""
    run = layout.run
    bt, lc = cache.block(run), cache.layer(layout)
    full = run.recompute == "full"
    redo = {"none": 0.0, "selective": bt.attention_fw_s, "full": bt.layer_fw_s}[run.recompute]
    layer = bt.layer_fw_s + bt.layer_bw_s + redo + lc.tp_fw_s + tp_bw_exposed_s(bt, lc, run)
    layer += (lc.tp_fw_s + lc.ep_fw_s) if full else 0.0
    layer += lc.ep_fw_s + lc.ep_bw_s
    cp_fw = max(0.0, lc.cp_fw_s - bt.attention_fw_s)  # again when the attention is recomputed
    layer += cp_fw * (2 if run.recompute != "none" else 1)
    layer += max(0.0, lc.cp_bw_s - bt.attention_bw_s)
    pp, v = run.pp, layout.chunks
    out = []
    for s in range(pp):
        t = sum(layout.layers_per_stage[s]) * layer
        if s == 0:
            t += bt.embed_fw_s + bt.embed_bw_s + lc.tp_embed_fw_s + lc.tp_embed_bw_s
        if (pp * v - 1) % pp == s:
            t += bt.head_fw_s + bt.head_bw_s + lc.tp_head_fw_s + lc.tp_head_bw_s
        out.append(t)
    return out


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
        gather = cache.dp_both("all-gather", params, pb, layout.chunks, layout)
        scatter = cache.dp_both("reduce-scatter", params, gb, layout.chunks, layout)
        return layout.num_micro_batches * layout.chunks * (2 * gather + scatter)
    op = "reduce-scatter" if run.shards_optimizer else "all-reduce"
    n = layout.chunks * grad_buckets(layout)  # as `comm.grad_sync_s`, over every chunk
    grad = n * cache.dp_both(op, params, gb, n, layout)
    hidden = min(grad, backward_s) * (1 - 1 / run.buckets) if run.overlap_grad_reduce else 0.0
    exposed = grad - hidden
    if run.shards_optimizer:  # as `comm.param_gather_exposed_s`
        k = param_gather_buckets(layout)
        exposed += cache.dp_both("all-gather", params, pb, k, layout)
    return exposed


def _zero3_blocking_s(cache: ScreenCache, layout: Layout, s: int) -> float:
    """Blocking ZeRO-3 collectives (deepspeed-2021) of one micro-batch through stage ``s``."""
    r = layout.run
    memo = cache.zero3.setdefault((r.tp, r.cp, r.ep, layout.dp), {})  # per DP group
    pp, v = r.pp, layout.chunks
    total = 0.0
    for c, layers in enumerate(layout.layers_per_stage[s]):
        vs = c * pp + s
        first, last = vs == 0, vs == pp * v - 1
        fw, bw = zero3_blocking_s(cache.inputs, layout, layers, first=first, last=last, memo=memo)
        total += fw + bw
    return total


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
    per_mb = _stage_mb_s(cache, layout)
    m, v, pp = layout.num_micro_batches, layout.chunks, run.pp
    if run.zero3_blocks:
        per_mb = [t + _zero3_blocking_s(cache, layout, s) for s, t in enumerate(per_mb)]
    if run.pp_blocking_sends and pp > 1:  # each chunk's forward and backward wait on a send
        per_mb = [t + 2 * v * lc.pp_hop_s for t in per_mb]
    # Hops: the fill and drain cross every boundary; 1F1B's steady state waits one round
    # way per micro-batch when compute is short (GPipe streams its forwards).
    hops = pp * v - 1 + ((m - 1) / 2 if pp > 1 and run.schedule != "gpipe" else 0)
    fb = max(per_mb) * (m + (pp - 1) / v) + 2 * hops * lc.pp_hop_s
    params = cache.stage_params(layout)
    adam = cache.block(run).adam_s_per_param
    last_bw = 2.0 / 3.0 * min(per_mb) / v
    tail = max(
        _dp_s(cache, layout, p, last_bw) + optimizer_params(*p, layout) * adam for p in set(params)
    )
    iteration = fb + tail
    return Screened(
        iteration_s=iteration,
        tokens_per_s=inputs.global_batch_size * inputs.seq_len / iteration,
        memory=_memory(cache, layout, [p for p, _ in params]),
    )
