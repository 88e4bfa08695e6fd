"""A sweep's results when layouts fail at simulation time (found by the s16 procurement audit):
the other rows are all kept, on Ray as serially; an option whose simulated candidates all
raised read "no fitting layout simulated; raise --per-context" in the report's table and
"not simulated" in the procurement figure, though they were simulated and failed; and a
multi-line exception message split the report's Errors list item over several lines. The
report's screen-error median was the upper middle value, and it named no time-vs-cost front."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simulator.plots as plots
from simulator import sweep_eval
from simulator.cli import main
from simulator.report import markdown_report, procurement_table, unranked_contexts
from simulator.report_notes import cost_time_front, screen_error
from simulator.rows import Row
from simulator.saved_rows import load_rows
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario
from simulator.sweep import RayOptions, run_sweep
from simulator.sweep_eval import build_shared
from tests.support import drawn, simulated_row

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


def test_the_screen_error_median_of_an_even_count_is_the_middle_twos_mean() -> None:
    """The note took the upper middle value: 2.3% where procurement-70b's median is 2.2%."""
    rows = [
        simulated_row("a", 8, 1e5, key=str(i), screen_tokens_per_s=1e5 * (1 + e))
        for i, e in enumerate((0.01, -0.02, 0.03, 0.04))
    ]
    assert screen_error(rows) == pytest.approx((0.025, 0.04))
    assert "median |error| 2.5%, max 4.0%" in markdown_report(rows, title="t", pruned=())


def _row(option: str, n: int, tps: float, **extra: Any) -> Row:
    """A simulated, fitting row of a job of 1e8 tokens at ``tps`` tokens/s."""
    return simulated_row(option, n, tps, **({"train_tokens": 1e8} | extra))


def _dominated(a: Row, rows: list[Row]) -> bool:
    ta, ca = a["time_to_train_s"], a["cost_usd"]
    return any(
        b["time_to_train_s"] <= ta
        and b["cost_usd"] <= ca
        and (b["time_to_train_s"], b["cost_usd"]) != (ta, ca)
        for b in rows
    )


def test_the_cost_time_front_is_exactly_the_non_dominated_set() -> None:
    """The report named no time-vs-cost trade-off: which options are worth considering at all.
    Against brute force over every layout (not only each option's best), with ties: two
    options of the same time and cost are both on the front, and the rows' order is moot."""
    rng = np.random.default_rng(16)
    rows = []
    for i in range(12):
        n, price = int(rng.choice([8, 16, 32])), float(rng.choice([1.0, 2.0, 3.0]))
        for j in range(4):
            tps = float(rng.choice([1e5, 2e5, 3e5, 4e5])) * n
            rows.append(_row(f"o{i}", n, tps, key=f"l{j}", price_per_gpu_hour=price))
    for twin in ("twin1", "twin2"):  # the slowest and cheapest, the same: both on the front
        rows.append(_row(twin, 8, 1e3, price_per_gpu_hour=1e-6))
    rows.append(_row("noprice", 8, 1e9))  # fastest, unpriced: not compared
    priced = [r for r in rows if r["cost_usd"] is not None]
    want = {r["context"] for r in priced if not _dominated(r, priced)}
    front, beaten = cost_time_front(rows)
    assert {r["context"] for r in front} == want
    assert {r["context"] for r in beaten} == {r["context"] for r in priced} - want
    assert [r["time_to_train_s"] for r in front] == sorted(r["time_to_train_s"] for r in front)
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    assert cost_time_front(shuffled) == (front, beaten)
    assert {"twin1@8", "twin2@8"} <= want and len(want) >= 3 and beaten


def test_the_report_names_the_cost_time_front() -> None:
    rows = [
        _row("fast", 16, 4e5, price_per_gpu_hour=2.0),  # 250 s, 16 x 2 $/h x 250 s = 2.22 $
        _row("cheap", 8, 1e5, price_per_gpu_hour=1.0),  # 1000 s, 2.22 $: as cheap, slower
        _row("dear", 8, 1e5, price_per_gpu_hour=3.0),  # 1000 s, 6.67 $
        _row("cheapest", 4, 4e4, price_per_gpu_hour=1.0),  # 2500 s, 2.78 $: slower, dearer
    ]
    report = markdown_report(rows, title="t", pruned=())
    assert (
        "* Time vs cost, each option and size at its best layout: no other is both faster and "
        "cheaper than fast@16 (0.00289 days, 2.22 $) (the Pareto front); cheap@8, dear@8 and "
        "cheapest@4 are each no faster and no cheaper than one of those.\n"
    ) in report
    assert "Time vs cost" not in markdown_report(rows[:1], title="t", pruned=())


def test_the_figures_mark_the_fronts_they_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """The procurement figure showed time and cost side by side but not which options trade
    one for the other (now in bold, as the report's Notes name them); the throughput-vs-memory
    legend called its lines each context's front, though they join its simulated layouts only
    (screened points lie beside them)."""
    figs = drawn(monkeypatch, plots)
    rows = [
        _row("fast", 16, 4e5, price_per_gpu_hour=2.0),
        _row("cheap", 8, 1.5e5, price_per_gpu_hour=1.0),
        _row("dear", 8, 1e5, price_per_gpu_hour=3.0),
    ]
    plots.plot_procurement(rows, Path("unused.png"))
    (fig,) = figs
    bold = {t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_fontweight() == "bold"}
    assert bold == {r["context"] for r in cost_time_front(rows)[0]} == {"fast@16", "cheap@8"}
    assert "bold: the time-vs-cost Pareto front" in fig.texts[0].get_text()
    plots.plot_procurement(rows[:1], Path("unused.png"))  # one option: no front to mark
    assert "Pareto" not in figs[1].texts[0].get_text()
    plots.plot_pareto(rows, Path("unused.png"))
    legend = [t.get_text() for t in figs[2].axes[0].get_legend().get_texts()]
    assert "Pareto front of the simulated layouts (each its color)" in legend
