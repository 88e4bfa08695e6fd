"""`ScreenCache`: the screen's memoised prices of one context, kept by one worker.

Kernel block times and collective costs repeat across layouts, so the cache keeps them per
shard shape and per (collective, bytes, group): block times (`stagecost.block_times`), a
layer's communication (`comm.layer_comm`), the parameters each stage holds, the DP, norm and
embedding gradient collectives. `screen.screen` prices a layout from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forecast.predict import LatencyTable
from simulator.comm import LayerComm, collective_s, layer_comm
from simulator.finalize_grads import embedding_grad_sync_s, norm_grad_sync_s
from simulator.parallel import Layout, RunConfig
from simulator.scenario import SimInputs
from simulator.stagecost import BlockTimes, block_times, shard_kernels
from simulator.stepcosts import stage_expert_params, stage_params


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
    norms: dict[tuple[Any, ...], tuple[float, ...]] = field(default_factory=dict)

    def block(self, run: RunConfig) -> BlockTimes:
        """Kernel seconds per block for this shard shape (with how CP runs its attention core,
        `context_parallel.schedule_core`, and whether the weight-gradient GEMMs fuse the
        gradient adds: `RunConfig.grad_accumulation_fusion`)."""
        shape = (run.tp, run.cp, run.ep, run.micro_batch_size, run.sequence_parallel)
        key = (*shape, run.cp_comm_type, run.grad_accumulation_fusion)
        if key not in self.blocks:
            sk = shard_kernels(self.inputs, run)
            self.blocks[key] = block_times(sk, self.table, run)
        return self.blocks[key]

    def layer(self, layout: Layout) -> LayerComm:
        """Per-layer communication seconds for this shard shape and group placement."""
        r = layout.run
        # the shard shape, and where the hops and the groups priced lie
        shape = (r.tp, r.cp, r.ep, r.micro_batch_size, r.sequence_parallel, r.cp_comm_type)
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

    def norm_sync(self, layout: Layout) -> tuple[float, ...]:
        """Per stage, sequence parallelism's norm-gradient all-reduce over TP
        (`finalize_grads.norm_grad_sync_s`), per TP width and split of the layers."""
        r = layout.run
        key = ("norm", r.tp, r.sequence_parallel, r.pp, layout.layers_per_stage)
        if key not in self.norms:
            self.norms[key] = norm_grad_sync_s(self.inputs, layout)
        return self.norms[key]

    def embedding_sync(self, layout: Layout) -> float:
        """The tied embedding's gradient all-reduce (`finalize_grads`), per TP width and
        where the first and the last stage lie."""
        r = layout.run
        key = ("embedding", r.tp, r.cp, r.pp, layout.dp)
        if key not in self.colls:
            self.colls[key] = embedding_grad_sync_s(self.inputs, layout)
        return self.colls[key]

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
        (`dp_comm.dp_grad_s`)."""
        total, expert = params
        dense = self.dp(op, (total - expert) * itemsize / parts, layout)
        return dense + self.dp(op, expert * itemsize / parts, layout, expert=True)
