"""Predict one whole-model run on one GPU: op graph -> forecast table -> sums per phase.

Costs beyond the kernels (`Overheads`), fitted on the labels of the kernel-training GPUs only
(P4, P100, T4, V100, A100-PCIE-40GB) by `e2e_validate.fit_overheads`:

* ``gap_s``: idle time between consecutive kernels of an eager stream (launch latency,
  allocator, tiny kernels' ramp), added to every launch;
* ``host_s``: host time per framework op (Python dispatch, autograd bookkeeping). The GPU
  runs asynchronously, so a phase takes ``max(GPU time, host time)``: small batches on fast
  GPUs are host-bound. Host ops = kernel launches + the inventory's kernel-less ops.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, ConfigDict, Field

from forecast.gpus import GPUSpec
from forecast.predict import LatencyModel, LatencyTable
from forecast.stream import stream_table
from simulator.memory import GIB, MemoryEstimate, estimate_memory
from simulator.models import ModelSpec
from simulator.opgraph import OpGraph, Phase, Workload, build_ops, on_gpu


class Overheads(BaseModel):
    """Fitted per-launch and per-host-op costs, seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gap_s: float = Field(ge=0)
    host_s: float = Field(ge=0)
    fitted_on: tuple[str, ...] = ()


# `e2e_validate.fit_overheads` with tile-mlp on the training GPUs' 45 labelled runs, kernels at
# their in-stream device times (`forecast.stream`): the grid minimum is at zero for both (those
# runs are large and GPU-bound), so no overhead is applied by default. Roofline's fit (its
# times have no host floor to remove): gap 20 us, host 32.5 us.
FITTED = Overheads(
    gap_s=0.0,
    host_s=0.0,
    fitted_on=("a100-pcie-40gb", "p100-pcie-16gb", "p4", "t4", "v100-pcie-32gb"),
)
NO_OVERHEADS = Overheads(gap_s=0.0, host_s=0.0)


class E2EResult(BaseModel):
    """The prediction printed by ``tilesim predict``; times in ms as the labels are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    e2e_ms: float
    fw_ms: float
    bw_ms: float
    optimizer_ms: float
    by_family_ms: dict[str, float]
    memory_gib: float
    fits: bool


def phase_time_s(graph: OpGraph, table: LatencyTable, phase: Phase, over: Overheads) -> float:
    """Time of one phase: the larger of GPU time (kernels + gaps) and host time."""
    gpu = sum(op.count * (table[op.kernel] + over.gap_s) for op in graph.ops if op.phase is phase)
    host = (graph.launches(phase) + graph.host_ops[phase]) * over.host_s
    return max(gpu, host)


def family_times_s(
    graph: OpGraph, table: LatencyTable, over: Overheads, *, by_op: bool = False
) -> dict[str, float]:
    """Kernel time (with gaps) per op family over forward and backward: the family of each
    kernel, or with ``by_op`` the family of the framework op it serves, as a per-op trace
    attributes it: a backward kernel and a parameter's gradient accumulation (``NAME.acc``)
    count with the forward op ``NAME`` (a softmax's backward multiply is softmax time, a
    linear layer's ``add`` into its gradient is linear time)."""
    owner: dict[str, str] = {}
    if by_op:
        for op in graph.ops:
            if op.phase is Phase.FORWARD:
                owner.setdefault(op.name, op.kernel.family.value)
    out: dict[str, float] = defaultdict(float)
    for op in graph.ops:
        if op.phase is not Phase.OPTIMIZER:
            fam = owner.get(op.name.removesuffix(".acc"), op.kernel.family.value)
            out[fam] += op.count * (table[op.kernel] + over.gap_s)
    return dict(sorted(out.items()))


def predict_graph(graph: OpGraph, table: LatencyTable, over: Overheads) -> dict[Phase, float]:
    """Seconds per phase."""
    return {p: phase_time_s(graph, table, p, over) for p in Phase}


def predict_run(
    model: ModelSpec,
    gpu: GPUSpec,
    run: Workload,
    latency_model: LatencyModel,
    *,
    overheads: Overheads = FITTED,
) -> E2EResult:
    """Forecast one inference pass or training step (optimizer reported apart); Megatron's
    flash attention falls back to its unfused attention where the GPU has none (`on_gpu`)."""
    run = on_gpu(run, gpu)
    graph = build_ops(model, run)
    mem = estimate_memory(model, run, gpu)
    return graph_result(graph, gpu, latency_model, mem, overheads=overheads)


def graph_result(
    graph: OpGraph,
    gpu: GPUSpec,
    latency_model: LatencyModel,
    mem: MemoryEstimate,
    *,
    overheads: Overheads = FITTED,
) -> E2EResult:
    """Forecast an op graph's kernels and sum them per phase and per family."""
    table = stream_table(graph.kernels(), gpu, latency_model)
    t = predict_graph(graph, table, overheads)
    fw, bw = t[Phase.FORWARD], t[Phase.BACKWARD]
    return E2EResult(
        e2e_ms=(fw + bw) * 1e3,
        fw_ms=fw * 1e3,
        bw_ms=bw * 1e3,
        optimizer_ms=t[Phase.OPTIMIZER] * 1e3,
        by_family_ms={k: v * 1e3 for k, v in family_times_s(graph, table, overheads).items()},
        memory_gib=mem.total_bytes / GIB,
        fits=mem.fits,
    )
