"""The screen's pipeline sends against the execution graph when a send outlasts a chunk's
forward (session 12). Equal stages, free optimizer, as in `test_schedule_audit_s11`; the grid:
pp 2, 4, 8; m = pp, 2 pp, 4 pp; sends of 0.1 to 4 chunk forwards; backward 2x and 1x forward."""

from __future__ import annotations

import itertools

import pytest

from simulator.execgraph import build_exec_graph
from simulator.pipeline_forms import pipeline_hops, pipeline_sends_s
from simulator.scheduler import schedule
from simulator.task_costs import ChunkCost, StepCosts

RATIOS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)  # send / chunk forward
BACKWARD = (2.0, 1.0)  # backward / forward


def _graph_s(name: str, pp: int, m: int, v: int, chunk: tuple[float, float], hop_s: float) -> float:
    """Forward-backward span of the execution graph, every chunk alike."""
    c = ChunkCost(fw_compute_s=chunk[0], bw_compute_s=chunk[1])
    costs = StepCosts(
        chunks=tuple(tuple(c for _ in range(v)) for _ in range(pp)),
        num_micro_batches=m,
        schedule=name,
        pp_hop_s=hop_s,
        optimizer_s=(0.0,) * pp,
        param_gather_s=(0.0,) * pp,
        overlap_grad_reduce=False,
    )
    return schedule(build_exec_graph(costs)).makespan_s


def _screen_s(
    name: str, pp: int, m: int, v: int, chunk: tuple[float, float], hop_s: float
) -> float:
    """The screen's span for equal stages: ``T (m + (pp-1)/v)`` plus its sends."""
    stage = (v * chunk[0], v * chunk[1])
    return sum(stage) * (m + (pp - 1) / v) + pipeline_sends_s(name, [stage] * pp, m, v, hop_s)


def _grid(pps: tuple[int, ...], groups: tuple[int, ...]) -> list[tuple[int, int, float, float]]:
    """(pp, m, backward, send) with a chunk forward of 1 s."""
    return [(pp, g * pp, b, r) for pp, g, b, r in itertools.product(pps, groups, BACKWARD, RATIOS)]


def test_gpipe_sends_of_any_length_are_the_fill_and_the_drain() -> None:
    """GPipe's forwards and backwards are each a flow shop: a send delays every later stage
    by the same amount however long it is, so ``2 (pp - 1)`` sends stay exact."""
    for pp, m, b, r in _grid((2, 4, 8), (1, 2, 4)):
        want = _graph_s("gpipe", pp, m, 1, (1.0, b), r)
        assert _screen_s("gpipe", pp, m, 1, (1.0, b), r) == pytest.approx(want, rel=1e-9)


def test_1f1b_sends_of_any_length_are_round_trips() -> None:
    """1F1B's critical path holds all ``m + pp - 1`` forwards and backwards and
    ``2 pipeline_hops`` sends whatever the send's length (one path for every send), so the
    screen is exact past a chunk's forward and past its backward."""
    for pp, m, b, r in _grid((2, 4, 8), (1, 2, 4)):
        want = _graph_s("1f1b", pp, m, 1, (1.0, b), r)
        assert _screen_s("1f1b", pp, m, 1, (1.0, b), r) == pytest.approx(want, rel=1e-9)


def test_1f1b_sends_when_pp_does_not_divide_m() -> None:
    """``m = q pp + r`` (``1 <= r <= pp``): ``q + 1`` round trips, the last turning back
    ``r - 2`` stages above the first. The screen's ``(pp-1) m / pp + pp - 2`` read 0.78x to
    1.07x the graph's span at pp 2 to 8 and sends up to 10 forwards (pp 4, m 7: 14 sends on
    the path, it counted 14.5; pp 8, m 10: 28, it counted 29.5)."""
    for pp, m in itertools.product((2, 3, 4, 5, 8), range(1, 25)):
        for b, r in itertools.product(BACKWARD, (0.1, 1.0, 4.0, 10.0)):
            want = _graph_s("1f1b", pp, m, 1, (1.0, b), r)
            assert _screen_s("1f1b", pp, m, 1, (1.0, b), r) == pytest.approx(want, rel=1e-9)
    assert 2 * pipeline_hops("1f1b", 4, 7, 1) == 14
    assert 2 * pipeline_hops("1f1b", 8, 10, 1) == 28


@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_sends_longer_than_a_chunk_pace_the_steady_state(v: int) -> None:
    """Interleaved 1F1B, ``m <= 4 pp``: compute-paced with ``2 (pp v - 1)`` sends up to
    ``h = min(f, b)``; then each of the ``(m - pp)(v - 1)`` ring-linked pairs takes
    ``max(f, b) + h``; past ``2h = f + b`` the path trades a forward and a backward for an up
    and down pair of sends. The fill-and-drain count read 0.70x the graph's span at pp 8,
    m 32, sends of 4 chunk forwards (0.63x with backward = forward)."""
    for pp, m, b, r in _grid((2, 4, 8), (1, 2, 4)):
        want = _graph_s("1f1b-interleaved", pp, m, v, (1.0, b), r)
        got = _screen_s("1f1b-interleaved", pp, m, v, (1.0, b), r)
        assert got == pytest.approx(want, rel=1e-9)
    # below the shorter of a chunk's forward and backward: the old closed form, bit for bit
    for pp, m in ((4, 8), (8, 32)):
        stage = (v * 1.0, v * 2.0)
        for h in (0.1, 0.5, 1.0):
            hops_s = 2 * pipeline_hops("1f1b-interleaved", pp, m, v) * h
            assert pipeline_sends_s("1f1b-interleaved", [stage] * pp, m, v, h) == hops_s


def test_interleaved_with_many_groups_is_a_tight_lower_bound() -> None:
    """Past four groups of ``pp`` micro-batches the path finds a few more turns (two sends for
    a forward and a backward each) than the closed form counts: it stays a lower bound, within
    6% at sends of up to 4 chunk forwards (worst: pp 2, v 2, 5 groups, backward = forward)."""
    worst = 1.0
    for pp, g, v, b, r in itertools.product((2, 3, 4), (5, 8), (2, 3), (2.0, 1.0, 0.5), RATIOS):
        want = _graph_s("1f1b-interleaved", pp, g * pp, v, (1.0, b), r)
        got = _screen_s("1f1b-interleaved", pp, g * pp, v, (1.0, b), r)
        assert got <= want * (1 + 1e-12)
        worst = min(worst, got / want)
    assert 0.94 < worst < 0.95
