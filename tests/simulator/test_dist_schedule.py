"""Closed forms of pipeline schedules and properties of the scheduler."""

from __future__ import annotations

import itertools
from dataclasses import replace

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.execgraph import build_exec_graph
from simulator.results import _phases
from simulator.scheduler import critical_path, schedule
from simulator.schedules import SCHEDULES, in_flight
from simulator.task_costs import ChunkCost, StepCosts


def _uniform(pp: int, m: int, v: int, schedule_name: str, hop_s: float = 0.0) -> StepCosts:
    chunk = ChunkCost(fw_compute_s=1.0 / v, bw_compute_s=2.0 / v)
    return StepCosts(
        chunks=tuple(tuple(chunk for _ in range(v)) for _ in range(pp)),
        num_micro_batches=m,
        schedule=schedule_name,
        pp_hop_s=hop_s,
        optimizer_s=(0.0,) * pp,
        param_gather_s=(0.0,) * pp,
        overlap_grad_reduce=False,
    )


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (8, 16), (4, 1)])
def test_bubble_closed_form(name: str, pp: int, m: int) -> None:
    t = schedule(build_exec_graph(_uniform(pp, m, 1, name)))
    span, _, bubble = _phases(t)
    assert bubble == pytest.approx((pp - 1) / (m + pp - 1))
    assert span == pytest.approx(3.0 * (m + pp - 1))


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3)])
def test_interleaving_divides_bubble_by_v(pp: int, m: int, v: int) -> None:
    t = schedule(build_exec_graph(_uniform(pp, m, v, "1f1b-interleaved")))
    _, _, bubble = _phases(t)
    assert bubble == pytest.approx((pp - 1) / (v * m + pp - 1))


def test_every_task_scheduled_once() -> None:
    for name, fn in SCHEDULES.items():
        v = 2 if name == "1f1b-interleaved" else 1
        for order in fn(4, 8, v):
            assert len(order) == 2 * 8 * v
            assert len(set(order)) == len(order)


def test_in_flight_1f1b_vs_gpipe() -> None:
    assert [in_flight(o) for o in SCHEDULES["1f1b"](4, 8, 1)] == [4, 3, 2, 1]
    assert in_flight(SCHEDULES["gpipe"](4, 8, 1)[0]) == 8


@settings(max_examples=25, deadline=None)
@given(
    pp=st.integers(1, 4),
    m=st.integers(1, 6),
    hop=st.floats(0.0, 0.5),
    name=st.sampled_from(["gpipe", "1f1b"]),
)
def test_step_is_critical_path(pp: int, m: int, hop: float, name: str) -> None:
    g = build_exec_graph(_uniform(pp, m, 1, name, hop))
    t = schedule(g)
    path = critical_path(t)
    durations = [g.duration_s(n) for n in g.graph.nodes]
    sends = sum(g.delay_s(a, b) for a, b in itertools.pairwise(path))
    assert sum(g.duration_s(n) for n in path) + sends == pytest.approx(t.makespan_s)
    assert max(durations) <= t.makespan_s + 1e-12
    assert t.makespan_s <= sum(durations) + 2 * (pp - 1) * m * hop + 1e-12


def test_grad_buckets_overlap_backward() -> None:
    base = _uniform(2, 4, 1, "1f1b")
    sync = tuple(tuple(ChunkCost(1.0, 2.0, grad_sync_s=1.0) for _ in row) for row in base.chunks)
    late = schedule(build_exec_graph(replace(base, chunks=sync)))
    early = schedule(
        build_exec_graph(replace(base, chunks=sync, overlap_grad_reduce=True, buckets=4))
    )
    assert late.makespan_s == pytest.approx(15.0 + 1.0)
    assert early.makespan_s == pytest.approx(15.0 + 0.25)


def test_layouts_of_one_shape_share_the_frozen_graph() -> None:
    a = _uniform(4, 8, 1, "1f1b")
    b = replace(a, chunks=tuple(tuple(ChunkCost(2.0, 4.0) for _ in r) for r in a.chunks))
    ga, gb = build_exec_graph(a), build_exec_graph(b)
    assert ga.graph is gb.graph
    assert nx.is_frozen(ga.graph)
    # Same structure, twice the task times: the step doubles.
    ta, tb = schedule(ga), schedule(gb)
    assert ta.makespan_s == pytest.approx(3.0 * (8 + 4 - 1))
    assert tb.makespan_s == pytest.approx(2 * ta.makespan_s)
    assert ga.duration_s(("F", 0, 0, 0, 0)) == 1.0
    assert gb.duration_s(("F", 0, 0, 0, 0)) == 2.0


@pytest.mark.parametrize("hop", [0.0, 0.25])
def test_blocking_sends_hold_the_stage(hop: float) -> None:
    """GPipe, 2 stages, 2 micro-batches, F = 1, B = 2: sends overlapped end at 9 + 2h; when a
    send holds its stage (Megatron-LM's synchronous p2p) the chain gains two more hops."""
    base = replace(_uniform(2, 2, 1, "gpipe", hop), overlap_grad_reduce=False)
    free = schedule(build_exec_graph(base))
    held = schedule(build_exec_graph(replace(base, blocking_sends=True)))
    assert free.makespan_s == pytest.approx(9.0 + 2 * hop)
    assert held.makespan_s == pytest.approx(9.0 + 4 * hop)
