"""What a reader sees after a sweep: table amounts, the procurement and Pareto figures, the
report's heading, and failed layouts retried on a rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import simulator.plots as plots
import simulator.sweep_eval as sweep_eval
from simulator.cli import main
from simulator.report import amount_text, markdown_report, procurement_table, top_table
from simulator.rows import Row
from simulator.saved_rows import load_rows
from simulator.space import find_scenario
from tests.support import simulated_row

TINY = find_scenario("tiny-gpt-8gpu")


def _row(option: str, n: int, tps: float, **extra: Any) -> Row:
    """A simulated, fitting row of a fine-tuning-sized job: 1e8 tokens at ``tps`` tokens/s."""
    return simulated_row(option, n, tps, **({"train_tokens": 1e8} | extra))


def test_small_amounts_are_not_printed_as_zero() -> None:
    """1e8 tokens at 1e5 tokens/s on 8 GPUs: 1000 s = 0.01157 days, 8 x 1000/3600 GPU-hours x
    2 $ = 4.444 $, x 1000 W = 0.002222 MWh; the tables printed 0.0 days, 4 $ and 0 MWh."""
    rows = [_row("a", 8, 1e5, price_per_gpu_hour=2.0, power_w_per_gpu=1000.0)]
    r = rows[0]
    assert r["time_to_train_s"] == pytest.approx(1000.0)
    assert r["cost_usd"] == pytest.approx(8 * 1000 / 3600 * 2.0)
    assert r["energy_mwh"] == pytest.approx(8 * 1000 / 3600 * 1000.0 / 1e6)
    line = procurement_table(rows).splitlines()[-1].split(" | ")
    assert line[-3:] == ["0.0116", "4.44", "0.00222 |"]
    assert top_table(rows).splitlines()[-1].split(" | ")[-2:] == ["0.0116", "4.44 |"]
    # large amounts stay whole numbers with thousands separators
    assert [amount_text(v) for v in (1377127.4, 452.3, 20.54, None)] == [
        "1,377,127",
        "452",
        "20.5",
        "-",
    ]
    # absurd ones (a GPU failing every half hour: 10^226 days) in powers of ten
    assert [amount_text(v) for v in (999_999_999.0, 1.234e9, 2.5e226)] == [
        "999,999,999",
        "1.23e+09",
        "2.5e+226",
    ]


def _figure(monkeypatch: pytest.MonkeyPatch, draw: Any, rows: list[Row]) -> Figure:
    drawn: list[Figure] = []

    def keep(fig: Figure, path: Path) -> Path:
        drawn.append(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    draw(rows, Path("unused.png"))
    return drawn[0]


def test_an_option_without_power_has_no_energy_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """It was drawn as a bar of 0 MWh labelled "0", as if it used no energy."""
    rows = [
        _row("a", 8, 1e5, price_per_gpu_hour=2.0, power_w_per_gpu=1000.0),
        _row("b", 8, 2e5, price_per_gpu_hour=3.0),
    ]
    fig = _figure(monkeypatch, plots.plot_procurement, rows)
    days, cost, energy = fig.axes
    # the unit in which the largest value reads at least 1 (0.0116 days is 16.7 minutes)
    assert days.get_xlabel() == "time to train the token budget, minutes"
    assert cost.get_xlabel() == "cost (user-supplied prices), $"
    assert energy.get_xlabel() == "energy (user-supplied power), kWh"
    labels = [t.get_text() for t in energy.texts]
    # best first by tokens/s (test_walkthrough_s11): b (2e5 tokens/s), then a
    assert next(b.get_width() for b in energy.patches if isinstance(b, Rectangle)) == 0.0
    assert labels == ["no power", "2.22"]  # 8 x 1000/3600 h x 1000 W = 2.22 kWh
    assert [t.get_text() for t in cost.texts] == ["3.33", "4.44"]
    assert [t.get_text() for t in days.texts] == ["8.33", "16.7"]


def test_the_pareto_front_is_drawn_per_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """One front over every context traced only the fastest cluster's layouts."""
    big = [_row("a", 16, 10.0 * m, memory_gib_per_gpu=m) for m in (10.0, 20.0, 30.0)]
    small = [_row("a", 8, 1.0 * m, memory_gib_per_gpu=m) for m in (5.0, 15.0)]
    for i, r in enumerate(big + small):
        r["key"] += str(i)
    fig = _figure(monkeypatch, plots.plot_pareto, big + small)
    drawn = [np.asarray(line.get_xydata()).tolist() for line in fig.axes[0].lines]
    fronts = [f for f in drawn if f]  # the legend's sample line has no points
    assert sorted(fronts) == [
        [[5.0, 5.0], [15.0, 15.0]],
        [[10.0, 100.0], [20.0, 200.0], [30.0, 300.0]],
    ]


def test_report_heading_counts_the_rows_shown() -> None:
    rows = [_row("a", 8, 1e5), _row("b", 8, 2e5)]
    report = markdown_report(rows, title="t", pruned=(), k=10)
    assert "## Top 2\n" in report and "## Top 10" not in report
    assert "Ranked by tokens/s (simulated layouts only)" in report


def test_a_rerun_retries_failed_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout that failed (a worker out of memory) stayed failed on every rerun into the
    same folder, while a fresh folder would simulate it."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    args = ["sweep", str(TINY), "--serial", "--no-progress", "--out"]
    real = sweep_eval.simulate

    def flaky(inputs: Any, run: Any, table: Any) -> Any:
        if run.pp == 2:
            raise MemoryError("worker ran out of memory")
        return real(inputs, run, table)

    monkeypatch.setattr(sweep_eval, "simulate", flaky)
    assert main([*args, str(out)]) == 1
    assert any(r["status"] == "error" for r in load_rows(out))
    monkeypatch.setattr(sweep_eval, "simulate", real)
    assert main([*args, str(out)]) == 0
    assert main([*args, str(fresh)]) == 0
    assert load_rows(out) == load_rows(fresh)
    logged = [json.loads(x) for x in (out / "progress.jsonl").open()]
    assert len({(r["key"], r["tier"]) for r in logged}) == len(logged)
    assert not any(r["status"] == "error" for r in logged)
