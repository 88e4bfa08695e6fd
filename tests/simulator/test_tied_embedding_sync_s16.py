"""A tied word embedding under pipeline parallelism: the first stage (embedding) and the last
(head) each hold a copy of the ``vocab x hidden / tp`` table, and Megatron-LM all-reduces its
gradient between them after the flush, before the optimizer step (``finalize_model_grads``,
``_allreduce_word_embedding_grads``). tilesim held both copies but never synchronised them.

Closed form: the step grows by exactly the collective model's all-reduce of
``vocab * hidden / tp * 4`` bytes (fp32 main grads) between the two stages' GPUs; one stage
or an untied head leave the step as it was, bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simulator.comm import collective_s
from simulator.execgraph import build_exec_graph
from simulator.finalize_grads import embedding_grad_bytes, embedding_pair
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.scheduler import critical_path, schedule
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, simulate
from simulator.stepcosts import step_costs

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"
VOCAB, HIDDEN = 1024, 256


def _inputs(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=["model.n_layers=4", *sets]))


def _untied() -> SimInputs:
    """The tiny GPT with its own head (an inline GPT model is tied; `ModelSpec` knows both)."""
    inputs = _inputs()
    return replace(inputs, model=inputs.model.model_copy(update={"tied_embeddings": False}))


def test_the_step_grows_by_the_all_reduce_between_first_and_last_stage() -> None:
    inputs = _inputs()
    run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2)
    layout = layout_of(inputs, run)
    costs = step_costs(inputs, layout, latency_table(inputs, [run]))
    # ranks 0 (stage 0, node 0) and 4 (stage 1, node 1): tp * dp = 4 ranks per stage
    assert embedding_pair(layout, 4) == (0, 4)
    nbytes = VOCAB * HIDDEN / 2 * 4  # the tp shard of the table, fp32 main grads
    assert embedding_grad_bytes(inputs, layout) == nbytes
    want = collective_s("all-reduce", nbytes, (0, 4), inputs.cluster)
    assert want > 0
    assert costs.embedding_sync_s == want
    with_sync = schedule(build_exec_graph(costs))
    without = schedule(build_exec_graph(replace(costs, embedding_sync_s=0.0)))
    assert with_sync.makespan_s - without.makespan_s == pytest.approx(want, rel=1e-9)
    assert ("E",) in critical_path(with_sync)


def test_it_runs_after_both_ends_reduce_and_before_both_ends_update() -> None:
    inputs = _inputs()
    run = RunConfig(tp=1, pp=4, dp=2, micro_batch_size=1)
    layout = layout_of(inputs, run)
    g = build_exec_graph(step_costs(inputs, layout, latency_table(inputs, [run]))).graph
    node = ("E",)
    assert g.nodes[node]["comm"] == "pp"
    preds = set(g.predecessors(node))
    assert {p[1] for p in preds} == {0, 3}  # stages 0 and 3 only
    assert {("D", 0, 0, 0), ("D", 3, 0, 0)} <= preds  # after their DP reductions
    assert set(g.successors(node)) == {("O", 0), ("O", 3)}


@pytest.mark.parametrize(
    ("tied", "run"),
    [
        (False, RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2)),
        (True, RunConfig(tp=2, pp=1, dp=4, micro_batch_size=2)),
    ],
)
def test_untied_or_one_stage_is_unchanged(tied: bool, run: RunConfig) -> None:
    inputs = _inputs() if tied else _untied()
    layout = layout_of(inputs, run)
    table = latency_table(inputs, [run])
    costs = step_costs(inputs, layout, table)
    assert costs.embedding_sync_s == 0.0
    assert ("E",) not in build_exec_graph(costs).graph
    assert simulate(inputs, run, table).graph_nodes == len(build_exec_graph(costs).graph)


def test_the_pair_priced_spans_two_nodes_where_one_does() -> None:
    """6 GPUs on 4-GPU nodes in 2 stages of 3: rank 0 pairs with 3 inside node 0, rank 1 with
    4 across; the slower, cross-node pair is priced (as the pipeline hops are)."""
    inputs = _inputs("cluster.num_gpus=6", "training.global_batch_size=12")
    layout = layout_of(inputs, RunConfig(tp=1, pp=2, dp=3, micro_batch_size=1))
    assert embedding_pair(layout, 4) == (1, 4)


def test_the_screen_adds_it_too() -> None:
    inputs = _inputs()
    tied = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2)
    table = latency_table(inputs, [tied])
    cache = ScreenCache(inputs, table)
    est = screen(cache, tied)
    sync = cache.embedding_sync(layout_of(inputs, tied))
    est_untied = screen(ScreenCache(_untied(), table), tied)
    assert sync > 0
    # the untied head has the same compute; its table's DP reduction is the same too
    assert est.iteration_s - est_untied.iteration_s == pytest.approx(sync, rel=1e-9)
