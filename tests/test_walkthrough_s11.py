"""A new user's walk through the README: every sweep, serve and collective figure and the
sweep report read as a planner reads them. Each test names what the walk found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

import simulator.plots as plots
import simulator.serve_plots as serve_plots
from simulator.report import markdown_report, procurement_table, top_table
from simulator.rows import Row
from simulator.serve import PassTimes, ServeResult
from simulator.serve_request import ServeRequest
from tests.support import drawn, simulated_row
from topologies.plots import busbw_figure, predicted_busbw


def _row(option: str, n: int, tps: float, key: str = "x", **extra: Any) -> Row:
    """A simulated, fitting row: 1e8 tokens to train at ``tps`` tokens/s on ``n`` GPUs."""
    return simulated_row(option, n, tps, key, **({"train_tokens": 1e8} | extra))


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """The figures `_drawn` keeps are closed after each test (pyplot keeps them open)."""
    yield
    plt.close("all")


# cost = ceil(1e8 tokens / tokens per 1 s step) s / 3600 x GPUs x price: a@8 6.67 $,
# a@16 7.02 $, b@8 4.24 $;
# by tokens/s: a@16 (190k), b@8 (105k), a@8 (100k); by name: a@8, a@16, b@8
_OPTIONS = [
    _row("a", 8, 1.0e5, price_per_gpu_hour=3.0),
    _row("a", 16, 1.9e5, price_per_gpu_hour=3.0),
    _row("b", 8, 1.05e5, price_per_gpu_hour=2.0),
]


@pytest.mark.parametrize(
    ("by", "order"), [("cost", ["b@8", "a@8", "a@16"]), ("tokens", ["a@16", "b@8", "a@8"])]
)
def test_procurement_lists_options_best_first_by_the_stated_ranking(
    monkeypatch: pytest.MonkeyPatch, by: str, order: list[str]
) -> None:
    """procurement-70b --rank cost: the figure titled "ranked by cost" and the report's
    table listed b200@512 (1.12 M$), b200@1024 (1.23 M$), h100@512 (1.22 M$): by name."""
    costs = {r["context"]: r["cost_usd"] for r in _OPTIONS}
    assert costs["b@8"] == pytest.approx(953 / 3600 * 8 * 2.0)  # ceil(952.4) 1 s steps: 4.24 $
    table = procurement_table(_OPTIONS, by=by).splitlines()[2:]
    assert [f"{line.split(' | ')[0][2:]}@{line.split(' | ')[1]}" for line in table] == order
    kept = drawn(monkeypatch, plots)
    plots.plot_procurement(_OPTIONS, Path("unused.png"), by=by)
    labels = [t.get_text() for t in kept[0].axes[0].get_yticklabels()]
    assert labels == order  # top to bottom, as the table
    assert "best first" in kept[0].texts[0].get_text()


def test_step_column_keeps_three_significant_figures() -> None:
    """gpt3-175b-a100: the step column printed "19" between "18.9" and "19.1", the H100
    sweep "3.6" under "3.59", the tiny sweep "0.00026" under "0.000259"."""
    rows = [
        _row("a", 8, 3e5, key="1", iteration_s=18.9),
        _row("a", 8, 2e5, key="2", iteration_s=19.0),
        _row("a", 8, 1e5, key="3", iteration_s=0.00026),
        _row("a", 8, 9e4, key="4", iteration_s=1234.5),
    ]
    header, _, *lines = top_table(rows).splitlines()
    steps = [line.split(" | ")[header.split(" | ").index("step s")] for line in lines]
    assert steps == ["18.9", "19.0", "0.000260", "1,234"]


def test_scaling_over_one_size_draws_no_linear_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt3-175b-a100 (1,024 GPUs only): the legend listed "a100-sxm4-80gb: linear", a line
    of one point that was not drawn."""
    kept = drawn(monkeypatch, plots)
    plots.plot_scaling([_row("a", 8, 1e5)], Path("unused.png"))
    legend = [t.get_text() for t in kept[0].axes[0].get_legend().get_texts()]
    assert legend == ["a"]
    # two sizes: the reference is tokens/s x GPUs / the smallest GPU count
    plots.plot_scaling([_row("a", 8, 1e5), _row("a", 16, 1.9e5)], Path("unused.png"))
    ax = kept[1].axes[0]
    (ref,) = [line for line in ax.lines if line.get_label() == "a: linear"]
    assert list(ref.get_ydata()) == pytest.approx([1e5, 2e5])


def test_tokens_axes_print_whole_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Pareto, scaling and throughput axes read 0.8 ... 1.6 under a lone "1e7" in the
    corner (tiny sweep), or 900000 without separators (GPT-3 H100 sweep)."""
    big = {"train_tokens": None}  # no budget: the procurement figure draws tokens/s
    rows = [_row("a", 8, 7.9e6, **big), _row("a", 16, 1.4e7, **big), _row("a", 16, 9e6, "y", **big)]
    kept = drawn(monkeypatch, plots)
    plots.plot_pareto(rows, Path("unused.png"))
    plots.plot_scaling(rows, Path("unused.png"))
    plots.plot_procurement(rows, Path("unused.png"))  # no price: a tokens/s panel
    axes = [(kept[0].axes[0], "y"), (kept[1].axes[0], "y"), (kept[2].axes[0], "x")]
    for ax, which in axes:
        axis = ax.yaxis if which == "y" else ax.xaxis
        assert axis.get_offset_text().get_text() == ""
        ticks = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
        assert any("," in t for t in ticks), ticks  # 10,000,000 rather than 1.0 x 1e7


def test_report_notes_prices_only_when_the_scenario_has_some() -> None:
    """Every report said "Prices and power are the scenario's inputs", also the four
    shipped scenarios that give neither."""
    note = "Prices and power are the scenario's inputs"
    plain = [_row("a", 8, 1e5)]
    priced = [_row("a", 8, 1e5, price_per_gpu_hour=2.0)]
    assert note not in markdown_report(plain, title="t", pruned=[])
    assert note in markdown_report(priced, title="t", pruned=[])


def test_serve_at_gen_1_says_there_is_no_decode_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gen 1``: the right panel was an empty 0-1 frame titled "decode passes"."""
    req = ServeRequest(batch=4, prompt=512, gen=1)

    def by_batch(b: int) -> ServeResult:
        return ServeResult(
            prefill_ms=40.0 * b,
            decode_ms=0.0,
            tpot_ms=0.0,
            first_decode_ms=0.0,
            last_decode_ms=0.0,
            e2e_ms=40.0 * b,
            output_tokens_per_s=25.0,
            by_family_ms={},
            comm_ms=0.0,
            weights_gib=15.0,
            kv_cache_gib=0.0,
            activations_gib=0.0,
            memory_gib=15.0,
            fits=True,
            max_batch=8,
            usable_gib=79.0,
        )

    curve = PassTimes(req, None, [], [0.158], [0.0], [{}])  # type: ignore[arg-type]
    kept = drawn(monkeypatch, serve_plots)
    serve_plots.plot_serve(req, "t", curve, by_batch, 8, Path("unused.png"))
    right = kept[0].axes[1]
    said = " ".join(t.get_text() for t in right.texts)
    assert "no decode pass" in said and "158.0 ms" in said
    assert not right.axison  # no empty 0-1 axes


def test_busbw_figure_names_every_cluster_once_per_visible_line() -> None:
    """dgx-h100 x8 and hgx-h200 x8 predict the same curve (one NVSwitch generation): the
    H100's dashed line lay wholly under the H200's, a legend entry for an invisible line."""
    clusters = [("dgx-h100", 8), ("hgx-h200", 8), ("dgx-a100", 8)]
    assert predicted_busbw("dgx-h100", 8) == predicted_busbw("hgx-h200", 8)
    ax = busbw_figure(clusters, []).axes[0]
    ys = [tuple(line.get_ydata()) for line in ax.lines]
    assert len(ys) == 2 and len(set(ys)) == len(ys)  # no line hides another
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for server, gpus in clusters:
        assert sum(t.startswith(f"{server} x{gpus}") for t in labels) == 1
    assert "hgx-h200 x8 (same curve as dgx-h100 x8)" in labels
