"""The one pipeline function: `simulate(inputs, run, table) -> StepResult`.

Steps 3, 5, 6, 7 of the house pipeline: shard kernels and communication (`stepcosts`), the
execution graph (`execgraph`), its schedule (`scheduler`) and the summary (`results`). The
kernel forecast is done once outside (`latency_table`) and reused across layouts.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from forecast.predict import LatencyTable
from forecast.stream import stream_table
from simulator.context_parallel import check_attention
from simulator.dist_memory import MemoryBreakdown, stage_memory
from simulator.errors import ConfigError
from simulator.execgraph import build_exec_graph, exec_graph
from simulator.latency import latency_model_for
from simulator.parallel import Layout, RunConfig, check_run
from simulator.results import StepInfo, StepResult, summarize
from simulator.scenario import SimInputs
from simulator.scheduler import Timeline, compile_plan, schedule
from simulator.schedules import in_flight, stage_orders
from simulator.stagecost import kernels_for
from simulator.stepcosts import scatters_every_backward, stage_params, step_costs


def latency_table(inputs: SimInputs, runs: list[RunConfig]) -> LatencyTable:
    """Forecast every kernel the layouts need, once (one batched call per family)."""
    model = latency_model_for(inputs.latency_model)
    return stream_table(kernels_for(inputs, runs), inputs.gpu, model)


def layout_of(inputs: SimInputs, run: RunConfig) -> Layout:
    """Check a layout against the scenario (`ConfigError` names the key and the rule), its
    step graph included (`check_graph_size`): a sweep prunes what `simulate` would refuse."""
    layout = check_run(
        run,
        inputs.model,
        num_gpus=inputs.num_gpus,
        global_batch_size=inputs.global_batch_size,
        seq_len=inputs.seq_len,
        gpus_per_node=inputs.cluster.server.gpus_per_node,
    )
    check_graph_size(layout)
    check_attention(run.cp, inputs.attention)
    return layout


# Nodes of one step's execution graph that `simulate` builds: 100,000 take 10-20 s on this
# project's shared 2-core machine, so 200,000 stays under a minute; the largest published
# layout (`dist_validate`) has under 80,000 and the shipped sweeps' under 75,000.
MAX_GRAPH_NODES = 200_000


def graph_nodes(layout: Layout) -> int:
    """An upper bound of the nodes of ``layout``'s execution graph (`execgraph` schema): per
    stage and model chunk a forward and a backward task per micro-batch (ZeRO-3: and a
    gather per task, a reduce-scatter per backward; ZeRO-2 accumulating: the reduce-scatter),
    the last backward cut into ``buckets`` pieces and one reduction per bucket; per stage the
    optimizer step, its all-gather and its norms' TP all-reduce (sequence parallelism); a tied
    embedding's all-reduce."""
    run, m = layout.run, layout.num_micro_batches
    per_backward = m if scatters_every_backward(layout) else 0  # ZeRO-2's reduce-scatters
    tasks = 2 * m + (3 * m if run.zero_stage >= 3 else per_backward)
    return run.pp * layout.chunks * (tasks + 2 * run.buckets) + 3 * run.pp + 1


def check_graph_size(layout: Layout) -> None:
    """A `ConfigError` naming the key to change when the step graph would take minutes to
    build and schedule (10^6 sequences a step on a toy model, or 10^6 buckets)."""
    run, m = layout.run, layout.num_micro_batches
    nodes = graph_nodes(layout)
    if nodes <= MAX_GRAPH_NODES:
        return
    if run.buckets >= m:
        key, fix = "run.buckets", "use fewer DP gradient buckets"
    else:
        key = "training.global_batch_size"
        fix = "raise run.micro_batch_size or run.dp, or lower the global batch"
    raise ConfigError(
        f"{key}: {m:,} micro-batches and {run.buckets:,} buckets x {run.pp} stages x "
        f"{layout.chunks} chunks = {nodes:,} graph tasks; at most {MAX_GRAPH_NODES:,} are "
        f"simulated: {fix}"
    )


def peak_memory(inputs: SimInputs, layout: Layout) -> MemoryBreakdown:
    """The fullest GPU's memory over all pipeline stages."""
    run = layout.run
    orders = stage_orders(run.schedule, run.pp, layout.num_micro_batches, layout.chunks)
    params = stage_params(inputs, layout)
    stages = [
        stage_memory(inputs, layout, s, params[s], in_flight(orders[s])) for s in range(run.pp)
    ]
    return max(stages, key=lambda m: m.total_bytes)


def clear_graph_caches() -> None:
    """Forget every cached graph shape, compiled plan and schedule order (the next layout of
    each shape builds its graph again: what a first, cold simulation costs)."""
    for cache in (exec_graph, compile_plan, stage_orders):
        cache.cache_clear()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a graph is built: its many small dicts hold no cycles worth
    a rescan."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _step_info(inputs: SimInputs, layout: Layout) -> StepInfo:
    return StepInfo(
        model=inputs.model,
        layout=layout,
        seq_len=inputs.seq_len,
        global_batch_size=inputs.global_batch_size,
        num_gpus=inputs.num_gpus,
        peak_flops_per_s=inputs.gpu.peak_for(inputs.dtype),
        memory=peak_memory(inputs, layout),
    )


def simulate_timeline(
    inputs: SimInputs, run: RunConfig, table: LatencyTable
) -> tuple[StepResult, Timeline]:
    """Simulate one layout; also return the timeline (for traces)."""
    layout = layout_of(inputs, run)  # the graph's size included
    with _gc_paused():
        timeline = schedule(build_exec_graph(step_costs(inputs, layout, table)))
        return summarize(timeline, _step_info(inputs, layout)), timeline


def simulate(inputs: SimInputs, run: RunConfig, table: LatencyTable) -> StepResult:
    """Predict one training step of ``run`` (a pure function of its three inputs)."""
    return simulate_timeline(inputs, run, table)[0]
