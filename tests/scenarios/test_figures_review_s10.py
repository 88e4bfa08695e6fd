"""A planner's review of the sweep's figures and report, and of ``tilesim serve --plot``: the
numbers a figure prints agree with the report's tables, labels and legends lie inside the
figure without covering what they label, the Pareto front is the non-dominated set, and the
report says what every column it prints means."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

import simulator.plots as plots
import simulator.serve_plots as serve_plots
from simulator.report import markdown_report, procurement_table, rank, top_table
from simulator.rows import Row
from simulator.serve import PassTimes, ServeResult
from simulator.serve_request import ServeRequest
from tests.support import drawn, simulated_row


def _row(option: str, n: int, tps: float, key: str = "x", **extra: Any) -> Row:
    """A simulated, fitting row: a 1 s step at ``tps`` tokens/s on ``n`` GPUs of an
    interleaved, sequence-parallel layout."""
    fields: dict[str, Any] = {
        "tp": 4,
        "pp": 8,
        "dp": n // 32,
        "schedule": "1f1b-interleaved",
        "virtual_stages": 4,
        "sequence_parallel": True,
        "zero_stage": 1,
        "mfu": 0.503,
        "bubble_fraction": 0.0978,
        "memory_gib_per_gpu": 56.7,
        "optimizer_s": 0.002,
        "exposed_tp_s": 0.29,
        "exposed_pp_s": 0.016,
        "exposed_dp_s": 0.2,
    }
    return simulated_row(option, n, tps, key, **(fields | extra))


def _box(artist: Any, fig: Figure) -> Bbox:
    return artist.get_window_extent(fig.canvas.get_renderer())


def _inside(inner: Bbox, outer: Bbox) -> bool:
    return (
        inner.x0 >= outer.x0 - 0.5
        and inner.x1 <= outer.x1 + 0.5
        and inner.y0 >= outer.y0 - 0.5
        and inner.y1 <= outer.y1 + 0.5
    )


def _labels(ax: Axes) -> list[Annotation]:
    return [t for t in ax.texts if isinstance(t, Annotation)]


# --- the scaling figure ------------------------------------------------------------------


def _scaling_rows() -> list[Row]:
    """Two options whose best layouts differ by 2% at each size (their labels met), MFU
    falling with size as the H100 GPT-3 sweep's did (55.7%, 53.8%, 50.3%)."""
    rows = []
    for option, gain in (("h100", 1.0), ("h200", 1.02)):
        for n, tps, mfu in (
            (512, 262_251.0, 0.557),
            (1024, 506_742.0, 0.538),
            (2048, 947_654.0, 0.503),
        ):
            rows.append(_row(option, n, tps * gain, mfu=mfu))
            rows.append(_row(option, n, tps * gain * 0.9, key="slow", mfu=mfu * 0.9))
    return rows


def test_scaling_mfu_labels_lie_inside_the_axes_and_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The largest cluster's MFU label was written to the right of its point, past the
    axes' right edge: across the frame on every sweep, wholly outside it on the
    procurement study. Two options of near throughput wrote theirs over each other."""
    kept = drawn(monkeypatch, plots)
    plots.plot_scaling(_scaling_rows(), Path("unused.png"))
    fig = kept[0]
    ax = fig.axes[0]
    frame = _box(ax, fig)
    boxes = [_box(t, fig) for t in _labels(ax)]
    assert len(boxes) == 6  # one per option and size
    assert all(_inside(b, frame) for b in boxes)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_scaling_points_are_each_sizes_best_and_print_the_reports_mfu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The x axis is the GPU count and each point the best layout of its size; its label
    printed MFU rounded to a whole percent (50%, 7%) where the report's tables print 50.3%
    and 7.5% for the same layout."""
    rows = _scaling_rows()
    kept = drawn(monkeypatch, plots)
    plots.plot_scaling(rows, Path("unused.png"))
    ax = kept[0].axes[0]
    assert ax.get_xlabel() == "GPUs"
    best = {r["context"]: r for r in reversed(rank(rows, "tokens"))}  # the first wins
    points = sorted(
        (tuple(p) for line in ax.lines if line.get_marker() == "o" for p in line.get_xydata()),
    )
    assert points == sorted((r["num_gpus"], r["tokens_per_s"]) for r in best.values())
    table = procurement_table(rows)
    for t in _labels(ax):
        x, y = t.xy
        r = next(r for r in best.values() if (r["num_gpus"], r["tokens_per_s"]) == (x, y))
        assert t.get_text().strip() == f"MFU {r['mfu']:.1%}"
        assert f"| {r['mfu']:.1%} |" in table  # the same text as the report's table


# --- the top-layouts figure --------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 12])
def test_top_layouts_legend_does_not_cover_the_axis_labels(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """The legend hung 0.12 of the axes' height below them: with fewer than about ten
    ranked layouts the axes were short and the legend lay over the x label."""
    rows = [_row("h100", 2048, 9e5 - i, key=str(i)) for i in range(n)]
    kept = drawn(monkeypatch, plots)
    plots.plot_top_layouts(rows, Path("unused.png"))
    fig = kept[0]
    ax = fig.axes[0]
    legend = _box(ax.get_legend(), fig)
    assert not legend.overlaps(_box(ax.xaxis.label, fig))
    assert not any(legend.overlaps(_box(t, fig)) for t in ax.get_xticklabels() if t.get_text())
    assert not legend.overlaps(_box(ax, fig))


def test_top_layouts_labels_print_the_tables_bubble_and_name_exposed_communication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bar's label read "bubble 10%" beside the table's 9.8% for the same layout, and the
    legend named the communication parts "tp", "pp", "dp" without saying they are the
    exposed part of that communication."""
    rows = [_row("h100", 2048, 9e5)]
    kept = drawn(monkeypatch, plots)
    plots.plot_top_layouts(rows, Path("unused.png"))
    ax = kept[0].axes[0]
    (label,) = [t.get_text() for t in ax.get_yticklabels()]
    header, *_, line = top_table(rows).splitlines()
    cell = line.split(" | ")[header.split(" | ").index("bubble")]
    assert cell == "9.8%" and f"bubble {cell}" in label
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "compute",
        "exposed tp comm.",
        "exposed pp comm.",
        "exposed dp comm.",
        "optimizer",
    ]


# --- the Pareto figure ---------------------------------------------------------------------


def test_pareto_front_is_the_brute_force_non_dominated_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per context, the drawn front is exactly the layouts no other layout of that context
    beats on both less (or equal) memory and more (or equal) tokens/s; ties in memory and
    in tokens/s included. (It was right; this guards it.)"""
    rng = random.Random(7)
    rows = []
    for n in (512, 1024):
        for i in range(60):
            mem = float(rng.choice(range(20, 80, 3)))
            tps = float(rng.choice(range(100, 200, 4))) * n
            rows.append(_row("h100", n, tps, key=str(i), memory_gib_per_gpu=mem))
    kept = drawn(monkeypatch, plots)
    plots.plot_pareto(rows, Path("unused.png"))
    fronts = sorted(
        sorted(map(tuple, np.asarray(line.get_xydata()).tolist()))
        for line in kept[0].axes[0].lines
        if len(line.get_xydata())
    )
    expected = []
    for n in (512, 1024):
        pts = {(r["memory_gib_per_gpu"], r["tokens_per_s"]) for r in rows if r["num_gpus"] == n}
        expected.append(
            sorted(p for p in pts if not any(q != p and q[0] <= p[0] and q[1] >= p[1] for q in pts))
        )
    assert fronts == sorted(expected)


# --- the report ----------------------------------------------------------------------------


def test_the_report_says_what_every_column_it_prints_means() -> None:
    """The report printed tokens/s, MFU, bubble and GiB/GPU without saying whose tokens, MFU
    by which FLOP count, idle over what, or which GPU's memory; nor what the top-layouts
    figure's exposed communication is."""
    rows = [_row("h100", 2048, 9e5)]
    report = markdown_report(rows, title="t", pruned=(), k=10)
    section = report.split("## Columns\n\n", 1)[1].split("\n## ", 1)[0]
    headers = set()
    for table in (top_table(rows), procurement_table(rows)):
        headers |= {h.strip() for h in table.splitlines()[0].strip("|").split("|")}
    headers -= {"#"}
    # the names a bullet explains: those in backticks before its colon
    bullets = re.findall(r"^\* ([^:]+):", section, flags=re.M)
    explained = {name for b in bullets for name in re.findall(r"`([^`]+)`", b)}
    assert headers <= explained, headers - explained
    # MFU's FLOP count: Narayanan et al. (2021), eq. 3, 3 x the forward pass, no recompute
    assert "Narayanan" in section and "recomput" in section and "peak" in section
    assert "exposed" in section and "critical path" in section


# --- tilesim serve --plot -------------------------------------------------------------------


def _serve_figure(monkeypatch: pytest.MonkeyPatch, *, tokens_scale: float = 1.0) -> Figure:
    """Batch 200 of a 1,024-token prompt does not fit (the largest that does is 143): its
    point is the rightmost, labelled "b=200 (does not fit)". Decode passes of 7.83 to 8.31
    ms, as Llama 3 8B's batch 16 on an H100 forecast."""
    req = ServeRequest(batch=200, prompt=1024, gen=64)

    def by_batch(b: int) -> ServeResult:
        tpot = 6.8 + 0.08 * b  # ms: a decode pass grows with the batch's KV reads
        e2e = 100.0 + 63 * tpot
        return ServeResult(
            prefill_ms=100.0,
            decode_ms=63 * tpot,
            tpot_ms=tpot,
            first_decode_ms=tpot,
            last_decode_ms=tpot,
            e2e_ms=e2e,
            output_tokens_per_s=b * 64 / e2e * 1e3 * tokens_scale,
            by_family_ms={},
            comm_ms=0.0,
            weights_gib=15.0,
            kv_cache_gib=0.1 * b,
            activations_gib=0.0,
            memory_gib=15.0 + 0.1 * b,
            fits=b <= 143,
            max_batch=143,
            usable_gib=79.0,
        )

    passes = [1, 16, 32, 48, 63]
    seconds = [0.3415] + [(7.83 + (8.31 - 7.83) * j / 63) * 1e-3 for j in passes]
    curve = PassTimes(req, None, passes, seconds, [0.0] * 6, [{}] * 6)  # type: ignore[arg-type]
    kept = drawn(monkeypatch, serve_plots)
    serve_plots.plot_serve(req, "t", curve, by_batch, 143, Path("unused.png"))
    return kept[0]


def test_serve_batch_labels_lie_inside_their_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request that does not fit is the fastest point; its label ran past the right
    edge of the axes into the gap between the panels."""
    fig = _serve_figure(monkeypatch)
    left = fig.axes[0]
    labels = _labels(left)
    assert any(t.get_text() == "b=200 (does not fit)" for t in labels)
    frame = _box(left, fig)
    assert all(_inside(_box(t, fig), frame) for t in labels)


def test_serve_throughput_ticks_do_not_run_into_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 50,000-3,000,000 tokens/s the whole-number ticks read "1,000,0002,000,000"."""
    fig = _serve_figure(monkeypatch, tokens_scale=200.0)
    ticks = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert "1M" in [t.get_text() for t in ticks]
    boxes = sorted((_box(t, fig) for t in ticks), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))


def test_serve_decode_curve_is_not_cut_by_the_top_of_its_axes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The y axis stopped at the curve's highest pass plus 5% of its 0.5 ms rise: the last
    markers were cut in half by the frame."""
    fig = _serve_figure(monkeypatch)
    right = fig.axes[1]
    (line,) = right.lines
    highest = float(np.max(np.asarray(line.get_ydata())))
    top_px = right.transData.transform((0.0, highest))[1]
    marker_px = line.get_markersize() / 2 * fig.dpi / 72 + line.get_linewidth() * fig.dpi / 72
    assert top_px + marker_px <= _box(right, fig).y1
