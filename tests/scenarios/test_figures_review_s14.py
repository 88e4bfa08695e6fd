"""Review of the user-facing figures and report (session 13): titles that say which job on
which hardware, a Pareto legend off the data, a log bus-bandwidth axis, square kernel panels,
and Notes that explain the report's "-" cells and what did not fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import simulator.plots as plots
from simulator.kernel_plots import _draw_family
from simulator.report import markdown_report
from simulator.rows import Row
from simulator.sweep_folder import sweep_study
from tests.support import drawn, simulated_row
from topologies.plots import busbw_figure

H100 = {"gpu": "H100 SXM5 80GB", "server": "dgx-h100", "network": "ib-ndr"}


def _rows(**extra: Any) -> list[Row]:
    return [
        simulated_row("h100", n, tps, key, memory_gib_per_gpu=mem, **(H100 | extra))
        for n, tps, key, mem in ((8, 1e5, "a", 40.0), (16, 1.9e5, "b", 30.0), (16, 1.7e5, "c", 20))
    ]


def test_sweep_figures_name_the_study_and_its_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sweep figure's title said what it plots ("Scaling: best layout at each cluster
    size") but neither the job nor the GPUs it ran on."""
    kept = drawn(monkeypatch, plots)
    for fn in plots.PLOTS.values():
        fn(_rows(), Path("unused.png"), study="gpt3-175b-h100")
    titles = [fig.axes[0].get_title() for fig in kept[:3]] + [kept[3]._suptitle.get_text()]
    for title in titles:
        assert title.startswith("gpt3-175b-h100 on H100 SXM5 80GB (dgx-h100 servers, ib-ndr)\n")


def test_pareto_legend_lies_beside_the_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The legend sat inside the axes: on the procurement study its six contexts covered
    screened layouts in the lower right."""
    kept = drawn(monkeypatch, plots)
    plots.plot_pareto(_rows(), Path("unused.png"))
    fig = kept[0]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))
    assert legend.x1 <= fig.bbox.x1 + 0.5  # and inside the figure


def test_report_names_hardware_and_explains_empty_days_and_memory() -> None:
    """Without a token budget every days and cost $ cell read "-", the Columns said "see
    Notes" and the Notes said nothing of it; the report never named the GPU; what did not
    fit read "515 x stage 0"."""
    rows = _rows()
    rows.append(
        simulated_row(
            "h100", 8, 0.0, "d", status="infeasible", reason="stage 0 needs 90 GiB > 74.5 GiB"
        )
    )
    text = markdown_report(rows, title="t", pruned=[])
    assert "Hardware: H100 SXM5 80GB (dgx-h100 servers, ib-ndr)." in text
    assert "the scenario sets no token budget (`sweep.train_tokens`)" in text
    assert "Do not fit in GPU memory: 1 layouts" in text and "1 at stage 0" in text
    budget = markdown_report(_rows(train_tokens=1e12), title="t", pruned=[])
    assert "no token budget" not in budget and "Every screened layout fits" in budget


def test_plot_redraw_reads_the_study_name(tmp_path: Path) -> None:
    """``tilesim plot DIR`` titles its figures as the sweep did (from scenario.resolved.json)."""
    assert sweep_study(tmp_path) == ""
    doc = {"rank": "tokens", "scenario": {"study": {"name": "llama3-70b-h100"}}}
    (tmp_path / "scenario.resolved.json").write_text(json.dumps(doc))
    assert sweep_study(tmp_path) == "llama3-70b-h100"


def test_busbw_axis_is_log_and_sizes_read_in_binary_units() -> None:
    """Bus bandwidth spans four decades over 1 KiB-8 GiB; on a linear axis every point under
    256 KiB lay on zero, and the sizes read 2^21."""
    fig = busbw_figure([("dgx-a100", 8)], [])
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert "1 KiB" in ticks and "2 GiB" in ticks
    assert "all-reduce" in ax.get_title().lower()


def test_kernel_panels_share_one_range_on_both_axes() -> None:
    """Each axis autoscaled to its own points: the predicted = measured diagonal ran at a
    different angle in every panel."""
    frame = pd.DataFrame(
        {
            "family": ["bmm"] * 3,
            "Device": ["L4"] * 3,
            "latency_s": [1e-4, 1e-3, 1e-1],
            "pred_s": [1e-6, 2e-3, 5e-2],
        }
    )
    fig, ax = plt.subplots()
    _draw_family(ax, "bmm", {"tile-mlp": frame}, {("tile-mlp", "L4"): (0, 0, 1, 1)})
    assert ax.get_xlim() == pytest.approx(ax.get_ylim())
    assert ax.get_aspect() == 1.0
    plt.close(fig)
