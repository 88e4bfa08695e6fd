"""ZeRO-2 with gradient accumulation (helper-a's closed-form audit): a rank that keeps only its
1/dp share of the gradients (Rajbhandari et al. 2020, stage 2; `dist_memory`) must
reduce-scatter every micro-batch's gradients after its backward, as DeepSpeed does ("for zero
stage 2 (and 3), gradient reduction is required after every backward because of gradient
partitioning", deepspeedai/DeepSpeed issue 2252) and FSDP's SHARD_GRAD_OP does. The simulator
counted the 1/dp gradients but reduced them once a step, as ZeRO-1 does: with 16
micro-batches the tiny model's ZeRO-2 step took ZeRO-1's 0.642 ms."""

from __future__ import annotations

import pytest

from simulator.dp_comm import dp_grad_s
from simulator.scenario import load_scenario, resolve
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, simulate_timeline
from simulator.space import find_scenario
from simulator.stepcosts import stage_params

TINY = find_scenario("tiny-gpt-8gpu")
DP8 = ("run.tp=1", "run.pp=1", "run.dp=8", "run.micro_batch_size=1")


def _run(zero: int, gbs: int, *sets: str):  # type: ignore[no-untyped-def]
    scenario = load_scenario(
        TINY, overrides=(*DP8, *sets, f"run.zero_stage={zero}", f"training.global_batch_size={gbs}")
    )
    inputs = resolve(scenario)
    table = latency_table(inputs, [scenario.run])
    res, t = simulate_timeline(inputs, scenario.run, table)
    return inputs, scenario.run, table, res, t


def test_zero2_reduce_scatters_every_micro_batch() -> None:
    """16 micro-batches: 16 reduce-scatters of the whole gradient (4 bytes a parameter over
    the dp group), one after each backward; the links carry ``m r``."""
    inputs, run, _, res, t = _run(2, 128)
    m = res.num_micro_batches
    assert m == 16
    (params,) = stage_params(inputs, layout_of(inputs, run))
    r = dp_grad_s(params, inputs, layout_of(inputs, run))  # one reduce-scatter of all of it
    scatters = [n for n in t.graph.nodes if n[0] == "R"]
    assert len(scatters) == m
    assert sum(t.step.duration_s(n) for n in scatters) == pytest.approx(m * r, rel=1e-12)
    assert not any(n[0] == "G" for n in t.graph.nodes)  # ZeRO-2 gathers no weights
    assert sum(t.step.duration_s(n) for n in t.graph.nodes if n[0] == "D") == 0.0
    (chunk,) = t.step.costs.chunks[0]
    compute = m * (sum(chunk.parts("F")) + sum(chunk.parts("B")))
    assert m * r > compute  # comm-bound: the links set the pace
    assert res.iteration_s >= m * r


def test_zero2_with_one_micro_batch_is_zero1s_step() -> None:
    """Without accumulation the one reduction a step is all ZeRO-2 needs: ZeRO-1's step."""
    one = _run(1, 8)[3]
    two = _run(2, 8)[3]
    assert one.num_micro_batches == 1
    assert two.iteration_s == one.iteration_s
    assert two.memory_gib_per_gpu < one.memory_gib_per_gpu


@pytest.mark.parametrize("gbs", [8, 128])
def test_screen_prices_zero2_like_the_simulation(gbs: int) -> None:
    """The closed-form screen reduces ZeRO-2's gradients as often as the graph does."""
    inputs, run, table, res, _ = _run(2, gbs)
    got = screen(ScreenCache(inputs, table), run).iteration_s
    assert got / res.iteration_s == pytest.approx(1.0, abs=0.1)
