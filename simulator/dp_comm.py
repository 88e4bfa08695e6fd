"""Data-parallel communication of one step: gradient reductions, parameter gathers, ZeRO-3.

DP runs over the dp x cp group: gradients (fp32 main grads for fp32/bf16/fp8, 16-bit for fp16)
are all-reduced, or reduce-scattered plus an all-gather of the updated 16-bit parameters when
the optimizer is sharded (ZeRO-1/2, distributed optimizer); ZeRO-3 gathers parameters before
every forward and backward and reduce-scatters gradients after every backward, and so does
ZeRO-2 with more than one micro-batch (it keeps only its share of the gradients:
`stepcosts.scatters_every_backward`). Expert parameters (MoE) are their own buffer, reduced and
gathered over the expert-data-parallel group instead: the dp x cp / ep ranks that hold the same
experts (Megatron-LM's ``expert_data_parallel_group``), so each DP collective below is one over
each group. The per-layer TP, CP, EP and PP communication is `comm`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.comm import collective_s
from simulator.memory import grad_itemsize_bytes, param_itemsize_bytes
from simulator.models import ModelSpec
from simulator.parallel import Layout
from simulator.scenario import SimInputs
from simulator.shard_params import end_tensors
from topologies import Cluster, collective_time_s
from topologies.algorithms import Op


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
    m, run = inputs.model, layout.run
    pb, gb = param_itemsize_bytes(inputs.dtype), grad_itemsize_bytes(inputs.dtype)
    hooks = _TensorHooks(layout, inputs.cluster, {} if memo is None else memo)
    ends = end_tensors(m, run, first=first, last=last)
    gather = _layers_s(hooks, m, "all-gather", pb, layers) + hooks.time_s("all-gather", ends, pb)
    scatter = _layers_s(hooks, m, "reduce-scatter", gb, layers)
    scatter += hooks.time_s("reduce-scatter", ends, gb)
    regather = 2 if run.recompute == "full" else 1
    eff = DEEPSPEED_2021_ZERO3_EFFICIENCY
    return gather / eff, (regather * gather + scatter) / eff


@dataclass(frozen=True, slots=True)
class _TensorHooks:
    """DeepSpeed-2021's per-tensor ZeRO-3 collectives over one layout's DP groups, each
    tensor's time kept in ``memo`` (keyed by collective, elements and expert group)."""

    layout: Layout
    cluster: Cluster
    memo: dict[tuple[Op, float, bool], float]

    def time_s(
        self, op: Op, tensors: Sequence[float], itemsize: int, *, expert: bool = False
    ) -> float:
        """Seconds of one ``op`` per tensor of ``tensors`` (elements each), in order, over the
        dp x cp group or with ``expert`` the expert-data-parallel one; 0.0 for a group of one."""
        group = self.layout.edp_group if expert else self.layout.dp_group
        if len(group) < 2:
            return 0.0
        total = 0.0
        for t in tensors:
            if (op, t, expert) not in self.memo:  # NCCL's only all-gather/reduce-scatter: ring
                self.memo[op, t, expert] = collective_time_s(
                    op, t * itemsize, group, self.cluster, algorithm="ring"
                )
            total += self.memo[op, t, expert]
        return total


def _layers_s(hooks: _TensorHooks, m: ModelSpec, op: Op, itemsize: int, layers: int) -> float:
    """One ``op`` over every parameter tensor of ``layers`` transformer layers: the dense
    layers' tensors, and a MoE layer's shared tensors plus its experts' (over their group)."""
    run = hooks.layout.run
    moe = m.moe_layers(layers)
    dense = m.layer_param_tensors(moe=False, tp=run.tp, ep=run.ep)
    shared = m.layer_param_tensors(moe=True, tp=run.tp, ep=run.ep, experts=False)
    experts = m.expert_param_tensors(tp=run.tp, ep=run.ep)
    moe_s = hooks.time_s(op, shared, itemsize) + hooks.time_s(op, experts, itemsize, expert=True)
    return (layers - moe) * hooks.time_s(op, dense, itemsize) + (moe * moe_s if moe else 0.0)
