"""The sweep figures' numbers: the top-layouts bars add up to each layout's step."""

from __future__ import annotations

import pytest

from simulator.plots import PARTS, _breakdown_s
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import run_sweep
from simulator.sweep_eval import build_shared


def test_top_layout_bars_add_up_to_the_step_with_compute_left_over() -> None:
    scenario = load_scenario(find_scenario("tiny-gpt-8gpu"))
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    rows = [r for r in run_sweep("simulate", space.points, shared) if r["status"] == "ok"]
    assert len(rows) > 10
    for r in rows:
        parts = _breakdown_s(r)
        assert set(parts) == set(PARTS)
        assert sum(parts.values()) == pytest.approx(r["iteration_s"], rel=1e-9)
        # compute is the remainder, never clamped away (the bubble is not stacked on top:
        # 20 of these 44 layouts' bars overran their step when it was)
        others = sum(v for k, v in parts.items() if k != "compute")
        assert r["iteration_s"] - others == pytest.approx(parts["compute"]) and others > 0


@pytest.mark.parametrize(
    ("seconds", "unit", "scale"),
    [(12.0, "s", 1.0), (1.0, "s", 1.0), (0.25, "ms", 1e3), (0.00021, "us", 1e6), (0.0, "us", 1e6)],
)
def test_step_time_axis_unit_reads_at_least_one(seconds: float, unit: str, scale: float) -> None:
    """tiny-gpt's 0.0002 s steps drew ticks 0.000000 0.000025 ... that overlapped."""
    from simulator.plots import time_unit

    assert time_unit(seconds) == (unit, scale)
