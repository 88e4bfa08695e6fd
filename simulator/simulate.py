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
from simulator.stepcosts import stage_params, step_costs


def latency_table(inputs: SimInputs, runs: list[RunConfig]) -> LatencyTable:
    """Forecast every kernel the layouts need, once (one batched call per family)."""
    model = latency_model_for(inputs.latency_model)
    return stream_table(kernels_for(inputs, runs), inputs.gpu, model)


def layout_of(inputs: SimInputs, run: RunConfig) -> Layout:
    """Check a layout against the scenario (`ConfigError` names the key and the rule)."""
    return check_run(
        run,
        inputs.model,
        num_gpus=inputs.num_gpus,
        global_batch_size=inputs.global_batch_size,
        seq_len=inputs.seq_len,
        gpus_per_node=inputs.cluster.server.gpus_per_node,
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


# Forward and backward tasks of one step's execution graph that `simulate` builds (about a
# kilobyte each): the largest published layouts have a few tens of thousands.
MAX_GRAPH_TASKS = 2_000_000


def simulate_timeline(
    inputs: SimInputs, run: RunConfig, table: LatencyTable
) -> tuple[StepResult, Timeline]:
    """Simulate one layout; also return the timeline (for traces)."""
    layout = layout_of(inputs, run)
    tasks = 2 * run.pp * layout.chunks * layout.num_micro_batches
    if tasks > MAX_GRAPH_TASKS:
        raise ConfigError(
            f"run: {layout.num_micro_batches:,} micro-batches x {run.pp} stages x "
            f"{layout.chunks} chunks = {tasks:,} graph tasks; at most {MAX_GRAPH_TASKS:,} are "
            "simulated: raise run.micro_batch_size or run.dp, or lower the global batch"
        )
    with _gc_paused():
        timeline = schedule(build_exec_graph(step_costs(inputs, layout, table)))
        return summarize(timeline, _step_info(inputs, layout)), timeline


def simulate(inputs: SimInputs, run: RunConfig, table: LatencyTable) -> StepResult:
    """Predict one training step of ``run`` (a pure function of its three inputs)."""
    return simulate_timeline(inputs, run, table)[0]
