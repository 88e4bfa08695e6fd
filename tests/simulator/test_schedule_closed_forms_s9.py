"""Pipeline schedules against their closed forms, and the layouts Megatron-LM's interleaved
schedule refuses (found by a schedule and layout-validation hunt)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.execgraph import build_exec_graph
from simulator.parallel import RunConfig, check_run
from simulator.results import _phases
from simulator.scenario import load_scenario, resolve
from simulator.scheduler import critical_path, schedule
from simulator.schedules import SCHEDULES, in_flight
from simulator.simulate import latency_table, simulate_timeline
from simulator.space import enumerate_space, find_scenario
from simulator.task_costs import ChunkCost, StepCosts

TINY = find_scenario("tiny-gpt-8gpu")
SIX = ("model.n_layers=6",)  # 6 layers: pp 2 x v 3 divides them, pp 2 x v 2 does not
INTERLEAVED = ("run.schedule='1f1b-interleaved'", "run.pp=2", "run.tp=2", "run.dp=2")


def _uniform(pp: int, m: int, v: int, name: str) -> StepCosts:
    """Every chunk: forward 1/v, backward 2/v; free sends and optimizer."""
    chunk = ChunkCost(fw_compute_s=1.0 / v, bw_compute_s=2.0 / v)
    return StepCosts(
        chunks=tuple(tuple(chunk for _ in range(v)) for _ in range(pp)),
        num_micro_batches=m,
        schedule=name,
        pp_hop_s=0.0,
        optimizer_s=(0.0,) * pp,
        param_gather_s=(0.0,) * pp,
        overlap_grad_reduce=False,
    )


# --- uneven virtual-stage splits -----------------------------------------------------------


def test_interleaving_needs_layers_divisible_by_pp_times_virtual_stages() -> None:
    """6 layers over pp 2 x v 2 were split 2/1/1/2 and simulated; Megatron-LM gives every
    model chunk the same layers and refuses it. Uneven plain-pipeline splits stay accepted."""
    model = resolve(load_scenario(TINY, overrides=SIX)).model

    def check(**run: object) -> tuple[tuple[int, ...], ...]:
        cfg = RunConfig.model_validate({"tp": 2, "dp": 2, **run})
        layout = check_run(cfg, model, num_gpus=8, global_batch_size=16, seq_len=128)
        return layout.layers_per_stage

    with pytest.raises(ConfigError, match=r"^run\.virtual_stages: .*n_layers = 6 .*2\*2"):
        check(pp=2, schedule="1f1b-interleaved", virtual_stages=2)
    assert check(pp=2, schedule="1f1b-interleaved", virtual_stages=3) == ((1, 1, 1), (1, 1, 1))
    assert check(pp=2, schedule="1f1b") == ((3,), (3,))
    with pytest.raises(
        ConfigError,
        match=r"^run\.schedule: .*micro-batches per replica \(1\) to be a multiple of pp = 2; ",
    ):
        check(pp=2, schedule="1f1b-interleaved", virtual_stages=3, micro_batch_size=8)


def test_simulate_refuses_an_uneven_interleaved_split_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "step.json"
    sets = [x for s in (*SIX, *INTERLEAVED, "run.virtual_stages=2") for x in ("--set", s)]
    assert main(["simulate", str(TINY), *sets, "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "run.virtual_stages" in err and "divisible by pp*virtual_stages" in err
    assert not trace.exists()


def test_sweep_prunes_uneven_interleaved_splits_by_rule() -> None:
    sets = (*SIX, "sweep.schedule=['1f1b-interleaved']", "sweep.virtual_stages=[2, 3]")
    space = enumerate_space(load_scenario(TINY, overrides=(*sets, "sweep.pp=[2]")))
    assert {p.virtual_stages for p in space.points} == {3}
    by_rule = {rule: (n, why) for rule, n, why in space.pruned_by}
    assert by_rule["run.virtual_stages"][0] > 0
    assert "divisible by pp*virtual_stages" in by_rule["run.virtual_stages"][1]
    assert sum(n for _, n, _ in space.pruned_by) == space.pruned


# --- closed forms with free communication --------------------------------------------------


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "1f1b-interleaved"])
def test_step_and_bubble_closed_forms_over_a_grid(name: str) -> None:
    """Forward 1/v, backward 2/v per chunk: the step is ``3m + 3(p-1)/v`` and the idle
    fraction ``(p-1)/(v m + p-1)`` (interleaved: ``m % p == 0``, Megatron-LM's rule)."""
    for pp, m in itertools.product((1, 2, 3, 4, 5), range(1, 13)):
        for v in (2, 3, 4) if name == "1f1b-interleaved" else (1,):
            if name == "1f1b-interleaved" and m % pp:
                continue
            span, _, bubble = _phases(schedule(build_exec_graph(_uniform(pp, m, v, name))))
            assert span == pytest.approx(3.0 * m + 3.0 * (pp - 1) / v, rel=1e-12)
            assert bubble == pytest.approx((pp - 1) / (v * m + pp - 1), rel=1e-12, abs=1e-15)


def test_gpipe_holds_more_in_flight_than_1f1b() -> None:
    for pp, m in itertools.product((2, 4, 8), (1, 4, 8, 16)):
        gpipe, ofob = SCHEDULES["gpipe"](pp, m, 1), SCHEDULES["1f1b"](pp, m, 1)
        assert [in_flight(o) for o in gpipe] == [m] * pp
        assert [in_flight(o) for o in ofob] == [min(pp - s, m) for s in range(pp)]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_forward_precedes_its_backward_on_every_stage(name: str) -> None:
    for pp, m in itertools.product((1, 2, 3, 4), (1, 2, 4, 8)):
        for v in (1, 2, 3) if name == "1f1b-interleaved" else (1,):
            if name == "1f1b-interleaved" and m % pp:
                continue
            for order in SCHEDULES[name](pp, m, v):
                done = set()
                for slot in order:
                    if slot.phase == "F":
                        done.add((slot.micro, slot.chunk))
                    else:
                        assert (slot.micro, slot.chunk) in done
            t = schedule(build_exec_graph(_uniform(pp, m, v, name)))
            for node, start in t.start_s.items():
                if node[0] == "B":
                    assert t.end_s[("F", *node[1:4], 0)] <= start


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(SCHEDULES)),
    pp=st.integers(1, 4),
    groups=st.integers(1, 4),
    v=st.integers(2, 3),
    seed=st.integers(0, 2**16),
    hop=st.floats(0.0, 0.5),
    blocking=st.booleans(),
    overlap=st.booleans(),
)
def test_step_is_never_shorter_than_the_busiest_stage(
    name: str,
    pp: int,
    groups: int,
    v: int,
    seed: int,
    hop: float,
    blocking: bool,
    overlap: bool,
) -> None:
    """Uneven stages, sends, TP and DP communication: the step covers each stage's compute
    stream plus its optimizer, and equals its critical path."""
    rnd = random.Random(seed)
    v = v if name == "1f1b-interleaved" else 1
    m = groups * pp if name == "1f1b-interleaved" else groups
    chunks = tuple(
        tuple(
            ChunkCost(
                rnd.uniform(0.1, 2.0),
                rnd.uniform(0.1, 4.0),
                fw_tp_s=rnd.uniform(0.0, 0.3),
                bw_tp_s=rnd.uniform(0.0, 0.3),
                grad_sync_s=rnd.uniform(0.0, 3.0),
            )
            for _ in range(v)
        )
        for _ in range(pp)
    )
    costs = StepCosts(
        chunks=chunks,
        num_micro_batches=m,
        schedule=name,
        pp_hop_s=hop,
        optimizer_s=tuple(rnd.uniform(0.0, 1.0) for _ in range(pp)),
        param_gather_s=(0.0,) * pp,
        overlap_grad_reduce=overlap,
        buckets=3,
        blocking_sends=blocking,
    )
    g = build_exec_graph(costs)
    t = schedule(g)
    for s, idx in enumerate(t.plan.compute):
        busy = sum(t.duration[i] for i in idx)
        assert busy + costs.optimizer_s[s] <= t.makespan_s * (1 + 1e-12)
    path = critical_path(t)
    sends = sum(g.delay_s(a, b) for a, b in itertools.pairwise(path))
    assert sum(g.duration_s(n) for n in path) + sends == pytest.approx(t.makespan_s, rel=1e-12)


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("run.pp_blocking_sends=true",),
        ("run.zero_stage=3", "run.zero3_impl='deepspeed-2021'"),
        ("run.overlap_grad_reduce=false",),
        ("run.tp_comm_overlap=false", "run.sequence_parallel=true"),
        ("run.cp=2", "run.tp=1"),
        (*SIX, *INTERLEAVED, "run.virtual_stages=3"),
    ],
)
def test_reported_parts_add_up_to_the_step(sets: tuple[str, ...]) -> None:
    """Step = compute on the critical path + its optimizer + the exposed communication; the
    bubble is each compute stream's idle share of the forward-backward span."""
    scenario = load_scenario(TINY, overrides=sets)
    inputs = resolve(scenario)
    res, t = simulate_timeline(inputs, scenario.run, latency_table(inputs, [scenario.run]))
    nodes = t.graph.nodes
    path = critical_path(t)
    compute = sum(t.step.parts(n)["compute_s"] for n in path if nodes[n]["kind"] == "compute")
    opt = sum(t.step.duration_s(n) for n in path if nodes[n]["kind"] == "optimizer")
    assert opt == res.optimizer_s
    total = compute + opt + sum(res.exposed_comm_s.values())
    assert total == pytest.approx(res.iteration_s, rel=1e-12)
    busy = [sum(t.duration[i] for i in idx) for idx in t.plan.compute]
    mean_busy = sum(busy) / len(busy)
    fb = res.forward_backward_s
    assert fb * (1.0 - res.bubble_fraction) == pytest.approx(mean_busy, rel=1e-12)
    assert max(busy) <= fb


def test_one_stage_step_is_m_micro_batches_plus_the_optimizer() -> None:
    """pp 1, dp 1: no sends, no gradient reduction; doubling m doubles forward-backward."""
    fb = []
    for gbs in (4, 8, 16):
        sets = ("run.pp=1", "run.tp=2", "run.dp=1", "cluster.num_gpus=2")
        scenario = load_scenario(TINY, overrides=(*sets, f"training.global_batch_size={gbs}"))
        inputs = resolve(scenario)
        res, t = simulate_timeline(inputs, scenario.run, latency_table(inputs, [scenario.run]))
        costs = t.step.costs
        (chunk,) = costs.chunks[0]
        m = costs.num_micro_batches
        assert m == gbs // 2
        one = sum(chunk.parts("F")) + sum(chunk.parts("B"))
        assert res.bubble_fraction == 0.0
        assert res.iteration_s == pytest.approx(m * one + costs.optimizer_s[0], rel=1e-12)
        fb.append(res.forward_backward_s)
    assert fb[1] == pytest.approx(2 * fb[0], rel=1e-12)
    assert fb[2] == pytest.approx(2 * fb[1], rel=1e-12)
