"""A sweep's results when layouts fail at simulation time (found by the s16 procurement audit):
the other rows are all kept, on Ray as serially; an option whose simulated candidates all
raised read "no fitting layout simulated; raise --per-context" in the report's table and
"not simulated" in the procurement figure, though they were simulated and failed; and a
multi-line exception message split the report's Errors list item over several lines."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from simulator import sweep_eval
from simulator.cli import main
from simulator.report import procurement_table, unranked_contexts
from simulator.saved_rows import load_rows
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import RayOptions, run_sweep
from simulator.sweep_eval import build_shared

TINY = find_scenario("tiny-gpt-8gpu")
TWO_OPTIONS = (
    'sweep.options=[{id = "a", price_per_gpu_hour = 2.0, power_w_per_gpu = 700.0}, '
    '{id = "b", gpu = "h100-sxm5-80gb", server = "dgx-h100", network = "ib-ndr", '
    "price_per_gpu_hour = 9.0, power_w_per_gpu = 1000.0}]"
)


def test_an_option_whose_simulations_all_failed_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    real = sweep_eval.simulate

    def broken_h100(inputs: Any, run: Any, table: Any) -> Any:
        if inputs.gpu.name.startswith("H100"):
            raise RuntimeError("kernel table lacks a shape\nsecond line")
        return real(inputs, run, table)

    monkeypatch.setattr(sweep_eval, "simulate", broken_h100)
    argv = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    assert main([*argv, "--set", "sweep.train_tokens=[1e9]", "--set", TWO_OPTIONS]) == 1
    rows = load_rows(out)  # complete and readable: one row per screened layout
    assert (
        len(rows)
        == len({r["key"] for r in rows})
        == len([json.loads(x) for x in (out / "progress.jsonl").open() if '"screen"' in x])
    )
    failed = [r for r in rows if r["status"] == "error"]
    assert {r["context"] for r in failed} == {"b@4", "b@8"}
    assert all(r["tier"] == "simulate" for r in failed)
    assert {r["context"] for r in rows if r["tier"] == "simulate"} == {"a@4", "a@8", "b@4", "b@8"}
    whys = {}
    for ctx in ("b@4", "b@8"):
        n = sum(r["context"] == ctx for r in failed)
        whys[ctx] = (
            "simulation failed",
            f"{n} simulated layout{'s' if n > 1 else ''} failed (see Errors)",
        )
    assert unranked_contexts(rows) == whys
    table = procurement_table(rows)
    assert all(why in table for _, why in whys.values()) and "raise --per-context" not in table
    report = (out / "report.md").read_text()
    errors = report.split("## Errors\n\n")[1].split("\n\n## ")[0].split("\n\n")
    assert len(errors) == min(20, len(failed))
    for item in errors:  # one line each
        assert "\n" not in item
        assert item.endswith(": RuntimeError: kernel table lacks a shape second line")


@pytest.mark.ray
def test_layouts_that_raise_on_ray_keep_the_others_rows() -> None:
    """Simulated on a real local Ray with one context's kernel table missing: that context's
    layouts are error rows with their tracebacks, every other row is the serial one."""
    scenario = load_scenario(TINY, overrides=("sweep.world_size=[4, 8]",))
    space = enumerate_space(scenario)
    assert len(space.contexts) == 2
    shared = build_shared(space, scenario.run)
    broken = replace(shared, tables=({}, *shared.tables[1:]))  # context 0 lacks its kernels
    points = space.points
    serial = run_sweep("simulate", points, broken, executor="serial")
    rows = run_sweep(
        "simulate", points, broken, executor="ray", chunk_size=3, ray_options=RayOptions(2)
    )
    assert [r["key"] for r in rows] == sorted(p.key(space.contexts[p.context].id) for p in points)
    bad = space.contexts[0].id
    assert all((r["status"] == "error") == (r["context"] == bad) for r in rows)
    assert all("KeyError" in r["reason"] and "Traceback" in r["error"] for r in rows if r["error"])
    assert [json.dumps(r) for r in rows] == [json.dumps(r) for r in serial]
