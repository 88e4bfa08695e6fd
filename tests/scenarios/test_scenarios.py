"""Every shipped scenario loads, resolves and yields at least one feasible layout (screened)."""

from __future__ import annotations

import pytest

from scenarios import SCENARIO_DIR, list_scenarios, load, scenario_path
from simulator.errors import ConfigError
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import run_sweep
from simulator.sweep_eval import build_shared

FAST = ("training.latency_model='roofline-derated'",)


def test_ids_cover_every_file() -> None:
    files = sorted(SCENARIO_DIR.glob("*.toml"))
    assert len(list_scenarios()) == len(files) >= 5
    for sid in list_scenarios():
        assert scenario_path(sid) == find_scenario(sid)
    with pytest.raises(ConfigError, match="unknown id"):
        scenario_path("no-such-study")


@pytest.mark.parametrize("sid", list_scenarios())
def test_scenario_yields_feasible_layouts(sid: str) -> None:
    scenario = load(sid, overrides=FAST)
    space = enumerate_space(scenario)
    assert space.points, f"{sid}: every layout pruned"
    # Screen a spread of layouts per context: enough to find a fitting one, fast.
    step = max(1, len(space.points) // 150)
    sample = space.points[::step]
    shared = build_shared(space, scenario.run)
    rows = run_sweep("screen", sample, shared)
    assert not [r["reason"] for r in rows if r["status"] == "error"]
    assert any(r["status"] == "ok" for r in rows), f"{sid}: no screened layout fits"


def test_procurement_lists_options_with_prices() -> None:
    space = enumerate_space(load("procurement-70b", overrides=FAST))
    options = {c.option for c in space.contexts}
    assert options == {"h100", "h200", "b200"}
    assert all(c.price_per_gpu_hour and c.power_w_per_gpu for c in space.contexts)
    # [reliability]: 50,000 GPU-hours between interruptions, shared by the cluster's GPUs
    assert all(c.checkpointing for c in space.contexts)
    assert {
        c.checkpointing.mtbf_s * c.inputs.num_gpus for c in space.contexts if c.checkpointing
    } == {50_000 * 3600.0}
    assert space.train_tokens == 2.0e12
