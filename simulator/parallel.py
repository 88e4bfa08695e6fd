"""How one training step runs: `RunConfig` (the parallel layout) and its rank groups.

Rank order is Megatron's: tp innermost, then cp, then dp, then pp. The simulator keeps one
DP replica and one TP shard (they are symmetric); the representative groups below are the
real rank sets its collectives span, so a 16k-GPU job still prices inter-node links correctly.
Invariants that need the model or the cluster (tp divides heads, tp*cp*pp*dp = GPUs, ...) are
checked in `check_run`, which raises `ConfigError` naming the key and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.models import ModelSpec
from simulator.run_checks import check_schedule, check_sizes, check_tp_nodes, micro_batches

Schedule = Literal["gpipe", "1f1b", "1f1b-interleaved"]
Recompute = Literal["none", "selective", "full"]
Zero3Impl = Literal["fsdp", "deepspeed-2021"]
CpCommType = Literal["p2p", "all_gather", "a2a"]


class RunConfig(BaseModel):
    """One parallel layout; ``dp = 0`` means "the GPUs left over by tp*cp*pp"."""

    # strict: a TOML ``true`` or ``2.0`` is not a parallel size, nor ``"yes"`` a switch
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tp: int = Field(default=1, gt=0, description="tensor parallel size (divides the heads)")
    pp: int = Field(default=1, gt=0, description="pipeline stages")
    dp: int = Field(default=0, ge=0, description="data parallel size; 0: num_gpus / (tp cp pp)")
    cp: int = Field(
        default=1,
        gt=0,
        description="context parallel size (TransformerEngine's attention, flash only; "
        "cp_comm_type picks how it communicates)",
    )
    cp_comm_type: CpCommType = Field(
        default="p2p",
        description="how context parallelism moves K,V (Megatron-LM --cp-comm-type): p2p "
        "(TransformerEngine's ring, sends hidden behind attention), all_gather (K,V gathered "
        "before attention, dK,dV reduce-scattered; exposed), a2a (DeepSpeed-Ulysses all-to-alls "
        "of Q,K,V and the output, heads split over cp; exposed)",
    )
    ep: int = Field(default=1, gt=0, description="expert parallel size (MoE), inside dp*cp")
    micro_batch_size: int = Field(default=1, gt=0, description="sequences per micro-batch")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule")
    virtual_stages: int = Field(
        default=1, gt=0, description="model chunks per stage (1f1b-interleaved)"
    )
    sequence_parallel: bool = Field(
        default=False, description="Megatron sequence parallelism (norms and dropout on s/tp)"
    )
    recompute: Recompute = Field(default="none", description="activation recomputation")
    zero_stage: int = Field(
        default=0,
        ge=0,
        le=3,
        description="ZeRO: 1 optimizer, 2 + gradients (reduce-scattered after every "
        "micro-batch's backward, as DeepSpeed stage 2 does), 3 + weights",
    )
    distributed_optimizer: bool = Field(
        default=False, description="Megatron's distributed optimizer (shards like ZeRO-1)"
    )
    overlap_grad_reduce: bool = Field(
        default=True, description="DP gradient reduction bucket by bucket under the backward"
    )
    tp_comm_overlap: bool = Field(
        default=True,
        description="backward TP collectives of the column-parallel linears overlap their "
        "GEMMs (Megatron-LM's async TP communication, on by default since late 2021)",
    )
    grad_accumulation_fusion: bool = Field(
        default=False,
        description="weight-gradient GEMMs accumulate into the fp32 main gradients themselves "
        "(Megatron-LM's --gradient-accumulation-fusion); false (default): an element-wise add "
        "per weight and micro-batch, which the published runs fit better (README: limitations)",
    )
    pp_blocking_sends: bool = Field(
        default=False,
        description="pipeline send-recvs hold the sending stage's compute stream until they "
        "finish (Megatron-LM's synchronous p2p of 2021-22); false: sends overlap compute",
    )
    overlap_param_gather: bool = Field(
        default=False,
        description="the sharded optimizer's all-gather of updated weights runs bucket by bucket "
        "under the next forward (Megatron-LM --overlap-param-gather): only the first bucket "
        "of the first chunk waits; needs overlap_grad_reduce (else one bucket)",
    )
    zero3_impl: Zero3Impl = Field(
        default="fsdp",
        description="how ZeRO-3 moves parameters: fsdp (gathers prefetched on their own "
        "stream, overlapping compute) or deepspeed-2021 (one blocking collective per parameter "
        "tensor, again for the recomputed forward, at a fitted 0.445 of NCCL's speed)",
    )
    buckets: int = Field(default=4, gt=0, description="DP gradient buckets per model chunk")

    @property
    def zero3_blocks(self) -> bool:
        """ZeRO-3 collectives on the compute stream's path (``zero3_impl = "deepspeed-2021"``)."""
        return self.zero_stage >= 3 and self.zero3_impl == "deepspeed-2021"

    @property
    def shards_optimizer(self) -> bool:
        """Optimizer state split over DP (ZeRO >= 1 or Megatron's distributed optimizer)."""
        return self.zero_stage >= 1 or self.distributed_optimizer


@dataclass(frozen=True, slots=True)
class Layout:
    """A checked `RunConfig` with its derived sizes and representative rank groups."""

    run: RunConfig
    dp: int
    num_micro_batches: int
    layers_per_stage: tuple[tuple[int, ...], ...]  # [stage][chunk]
    tp_group: tuple[int, ...]
    cp_group: tuple[int, ...]
    dp_group: tuple[int, ...]  # dp x cp ranks: the gradient-reduction group
    ep_group: tuple[int, ...]
    # dp x cp / ep ranks holding the same experts (Megatron's expert-data-parallel group):
    # expert gradients reduce, and expert state shards, over it
    edp_group: tuple[int, ...]
    # the (sender, receiver) ranks of every stage boundary of rank 0's pipeline (interleaving
    # also wraps from the last stage to the first): `comm.layer_comm` prices its hop at the
    # slowest, as stages need not start on a node boundary (tp*cp*dp 4 on 8-GPU nodes: 0->4
    # within a node, 4->8 across)
    pp_hops: tuple[tuple[int, int], ...]

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage, ``tp x cp x dp`` (Megatron's order: stages outermost)."""
        return self.run.tp * self.run.cp * self.dp

    @property
    def chunks(self) -> int:
        """Model chunks per stage (virtual stages with interleaving, else 1)."""
        return len(self.layers_per_stage[0])

    def sharded(self, params: float, expert: float) -> float:
        """One rank's share of ``params`` parameters, ``expert`` of them expert parameters,
        when their state is split over the ranks that hold them: dp x cp for the dense ones,
        `edp_group` (dp x cp / ep) for the experts."""
        shard = self.dp * self.run.cp
        return (params - expert) / shard + expert * self.run.ep / shard


def split_layers(num_layers: int, parts: int) -> list[int]:
    """Layers per virtual stage: even where possible, extra layers to the middle stages.

    The first and last virtual stages also hold the embedding and the head, so they are the
    last to receive a remainder layer (Llama 3 405B: 126 layers on 16 stages).
    """
    base, extra = divmod(num_layers, parts)
    order = [*list(range(1, parts - 1)), 0, parts - 1] if parts > 2 else list(range(parts))
    counts = [base] * parts
    for i in order[:extra]:
        counts[i] += 1
    return counts


def check_run(
    run: RunConfig,
    model: ModelSpec,
    *,
    num_gpus: int,
    global_batch_size: int,
    seq_len: int,
    gpus_per_node: int | None = None,
) -> Layout:
    """Validate a layout against the model and cluster; derive dp, micro-batches, groups.
    With ``gpus_per_node``, a TP group must sit inside one node or span whole nodes (a group
    of 3 on 8-GPU nodes straddles two), and the CP, DP and EP groups priced are those spanning
    the most nodes (`_widest_group`)."""
    dp = check_sizes(run, model, num_gpus)
    if gpus_per_node is not None:
        check_tp_nodes(run.tp, gpus_per_node)
    m = micro_batches(run, dp, global_batch_size=global_batch_size, seq_len=seq_len)
    check_schedule(run, model.num_layers, m)
    v = run.virtual_stages
    counts = split_layers(model.num_layers, run.pp * v)
    stages = tuple(tuple(counts[c * run.pp + s] for c in range(v)) for s in range(run.pp))
    tp, cp, ep = run.tp, run.cp, run.ep

    def group(step: int, n: int) -> tuple[int, ...]:
        return _widest_group(step, n, num_gpus, gpus_per_node)

    return Layout(
        run=run,
        dp=dp,
        num_micro_batches=m,
        layers_per_stage=stages,
        tp_group=tuple(range(tp)),
        cp_group=group(tp, cp),
        dp_group=group(tp, cp * dp),  # gradients reduce over dp x cp
        ep_group=group(tp, ep),
        edp_group=group(tp * ep, cp * dp // ep),
        pp_hops=_pp_hops(run.pp, tp * cp * dp, wrap=v > 1),
    )


def _widest_group(step: int, n: int, world: int, per_node: int | None) -> tuple[int, ...]:
    """The group of ``n`` ranks ``step`` apart (in blocks of ``step * n`` ranks) that spans the
    most nodes; rank 0's where blocks sit inside one node or on whole nodes, as then every
    group alike. Otherwise they differ (tp 1, dp 3 on 4-GPU nodes: stage 0's DP group (0,1,2)
    stays in node 0, stage 1's (3,4,5) crosses two) and rank 0's, the fastest, priced them all."""
    offsets = tuple(k * step for k in range(n))
    block = step * n
    if per_node is None or block % per_node == 0 or per_node % block == 0:
        return offsets
    bases = (j + i for j in range(0, world - block + 1, block) for i in range(step))
    best = max(bases, key=lambda b: (len({(b + o) // per_node for o in offsets}), -b))
    return tuple(best + o for o in offsets)


def _pp_hops(pp: int, stride: int, *, wrap: bool) -> tuple[tuple[int, int], ...]:
    hops = [(s * stride, (s + 1) * stride) for s in range(pp - 1)]
    return tuple([*hops, ((pp - 1) * stride, 0)] if wrap and pp > 1 else hops)
