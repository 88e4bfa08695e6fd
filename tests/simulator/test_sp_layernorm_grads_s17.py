"""Sequence parallelism's norm-gradient all-reduce over the TP group, once a step.

With sequence parallelism each TP rank runs the norms (and adds the row-parallel linears'
biases) on its own ``s / tp`` tokens, so the gradients of those replicated parameters differ
between the TP ranks. Megatron-core's ``finalize_model_grads`` sums them after the DP
reduction, before the optimizer step (``_allreduce_layernorm_grads``): every parameter marked
``sequence_parallel`` (LayerNorm / RMSNorm weights and biases, the final norm, the row-parallel
biases, a MoE router's weight) of all the stage's model chunks, flattened into one buffer of
main gradients (fp32 for bf16, `memory.grad_itemsize_bytes`), one all-reduce over the TP group.

Closed forms on the tiny GPT (h = 256, LayerNorm, biases): per layer 2 norms x (weight + bias)
+ 2 row-parallel biases = 6h elements; the final norm 2h on the stage holding the last layer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simulator.comm import collective_s
from simulator.execgraph import build_exec_graph
from simulator.finalize_grads import norm_grad_bytes, norm_grad_sync_s
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.scheduler import critical_path, schedule
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, simulate
from simulator.stepcosts import step_costs

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"
H = 256


def _inputs(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=["model.n_layers=4", *sets]))


def _sp(**fields: object) -> RunConfig:
    base: dict[str, object] = {"tp": 2, "pp": 1, "dp": 4, "micro_batch_size": 2}
    return RunConfig.model_validate({**base, "sequence_parallel": True, **fields})


def test_gpt_norm_and_bias_gradients_per_stage() -> None:
    """pp 2, 4 layers: stage 0 reduces 2 layers x 6h, stage 1 also the final norm's 2h; fp32
    main gradients for bf16."""
    inputs = _inputs()
    layout = layout_of(inputs, _sp(pp=2, dp=2))
    assert norm_grad_bytes(inputs, layout) == (2 * 6 * H * 4, (2 * 6 + 2) * H * 4)


def test_interleaved_stages_coalesce_their_chunks() -> None:
    """pp 2 x 2 chunks of 1 layer: each stage's two chunks go in one buffer; the last virtual
    stage (stage 1's chunk 1) holds the final norm."""
    inputs = _inputs("training.global_batch_size=32")
    run = _sp(pp=2, dp=2, micro_batch_size=1, schedule="1f1b-interleaved", virtual_stages=2)
    assert norm_grad_bytes(inputs, layout_of(inputs, run)) == (2 * 6 * H * 4, (2 * 6 + 2) * H * 4)


def test_llama_rmsnorm_has_weights_only() -> None:
    """RMSNorm and no biases (an inline swiglu model is Llama-like): 2h a layer, h final."""
    inputs = _inputs('model.activation="swiglu"')
    assert inputs.model.norm == "rmsnorm"
    assert not inputs.model.bias
    layout = layout_of(inputs, _sp())
    assert norm_grad_bytes(inputs, layout) == ((4 * 2 + 1) * H * 4,)


def test_a_moe_layer_adds_its_router() -> None:
    """Megatron-core's TopKRouter marks its ``E x h`` weight sequence-parallel: Mixtral-like,
    4 experts, every layer MoE: 4 layers x (2 norms + router) + final norm."""
    inputs = _inputs('model.activation="swiglu"', "model.num_experts=4")
    layout = layout_of(inputs, _sp())
    assert norm_grad_bytes(inputs, layout) == ((4 * (2 * H + 4 * H) + H) * 4,)


def test_fp16_reduces_16_bit_gradients() -> None:
    inputs = _inputs('training.dtype="fp16"')
    assert norm_grad_bytes(inputs, layout_of(inputs, _sp())) == ((4 * 6 + 2) * H * 2,)


@pytest.mark.parametrize("run", [_sp(sequence_parallel=False), _sp(tp=1, dp=8)])
def test_no_sequence_parallelism_or_one_tp_rank_has_no_collective(run: RunConfig) -> None:
    inputs = _inputs()
    layout = layout_of(inputs, run)
    table = latency_table(inputs, [run])
    costs = step_costs(inputs, layout, table)
    assert norm_grad_bytes(inputs, layout) == (0.0,)
    assert costs.norm_sync_s == (0.0,)
    graph = build_exec_graph(costs).graph
    assert not [n for n in graph if n[0] == "N"]
    assert simulate(inputs, run, table).graph_nodes == len(graph)


def test_the_step_grows_by_the_tp_all_reduce() -> None:
    """One stage, no DP overlap: the step grows by exactly the all-reduce of the stage's
    ``(4 x 6 + 2) h`` fp32 gradients over TP ranks (0, 1), and it is on the critical path."""
    inputs = _inputs()
    run = _sp(overlap_grad_reduce=False)
    layout = layout_of(inputs, run)
    costs = step_costs(inputs, layout, latency_table(inputs, [run]))
    want = collective_s("all-reduce", (4 * 6 + 2) * H * 4, (0, 1), inputs.cluster)
    assert want > 0
    assert costs.norm_sync_s == norm_grad_sync_s(inputs, layout) == (want,)
    with_sync = schedule(build_exec_graph(costs))
    without = schedule(build_exec_graph(replace(costs, norm_sync_s=(0.0,))))
    assert with_sync.makespan_s - without.makespan_s == pytest.approx(want, rel=1e-9)
    assert ("N", 0) in critical_path(with_sync)


def test_it_runs_after_the_dp_reduction_and_before_the_embedding_sync() -> None:
    """Megatron's order: ``finish_grad_sync`` (DP), then the norms' TP all-reduce, then the
    tied embedding's (first and last stage), then the optimizer."""
    inputs = _inputs()
    run = _sp(pp=4, dp=1, micro_batch_size=1, tp=2)
    layout = layout_of(inputs, run)
    g = build_exec_graph(step_costs(inputs, layout, latency_table(inputs, [run]))).graph
    for s in range(4):
        node = ("N", s)
        assert g.nodes[node]["comm"] == "tp"
        assert ("D", s, 0, 0) in set(g.predecessors(node))
        assert set(g.successors(node)) - {("E",)} == {("O", s)}
    # the embedding's all-reduce waits for both end stages' norms; the middle ones go on
    assert {("N", 0), ("N", 3)} <= set(g.predecessors(("E",)))
    assert not {("N", 1), ("N", 2)} & set(g.predecessors(("E",)))


def test_the_screen_prices_it_as_the_simulation_does() -> None:
    """One stage, no overlap: the closed-form screen equals the simulated step (as it does
    without sequence parallelism), the norm all-reduce included."""
    inputs = _inputs()
    run = _sp(overlap_grad_reduce=False)
    table = latency_table(inputs, [run])
    cache = ScreenCache(inputs, table)
    sim = simulate(inputs, run, table)
    layout = layout_of(inputs, run)
    assert cache.norm_sync(layout) == norm_grad_sync_s(inputs, layout)
    assert screen(cache, run).iteration_s == pytest.approx(sim.iteration_s, rel=1e-12)
    assert sim.exposed_comm_s["tp"] > 0
