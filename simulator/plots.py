"""Rows -> figures (matplotlib, Agg): one function per figure, all in `PLOTS`.

Every function takes the final rows, an output path and the ranking, reads only the rows and
writes one PNG; `plot_all` draws them all (``tilesim plot DIR`` redraws from ``rows.jsonl``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.text import Annotation
from matplotlib.transforms import offset_copy

from simulator.figures import place_labels, save_figure, whole_numbers
from simulator.procurement_panels import draw_panel, procurement_panels
from simulator.report import (
    RANKING_NAMES,
    TOP_K,
    amount_text,
    best_per_context,
    hardware_text,
    lacking_column,
    layout_label,
    procurement_entries,
    rank,
    unranked_contexts,
)
from simulator.report_notes import cost_time_front
from simulator.rows import Row

PARTS = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer")
COLORS = ("#4c72b0", "#dd8452", "#937860", "#da8bc3", "#55a868", "#c44e52", "#8172b3")
# a part's legend entry: the communication parts are the time the step waits on it
PART_NAMES = {p: p if p in ("compute", "optimizer") else f"exposed {p} comm." for p in PARTS}


def _breakdown_s(r: Row) -> dict[str, float]:
    """The step's critical path split into parts that add up to the step: exposed
    communication per kind, the optimizer, and compute (the remainder). The bubble is not a
    part: a GPU's idle time is spent waiting on those same paths (it is in the label)."""
    parts = {k: r[f"exposed_{k}_s"] or 0.0 for k in ("tp", "cp", "ep", "pp", "dp")}
    parts["optimizer"] = r["optimizer_s"] or 0.0
    parts["compute"] = max(0.0, r["iteration_s"] - sum(parts.values()))
    return parts


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit (s, ms or us) in which ``seconds`` reads as at least 1, and its scale: a
    0.0002 s axis in seconds printed ticks of eight digits that ran into each other."""
    for unit, scale in (("s", 1.0), ("ms", 1e3)):
        if seconds * scale >= 1:
            return unit, scale
    return "us", 1e6


def titled(rows: Sequence[Row], what: str, study: str = "") -> str:
    """A figure's title: the study and its hardware on a first line (every sweep figure's
    title said what it plots but not of which job on which GPUs), then ``what``."""
    hardware = hardware_text(rows)
    head = " on ".join(t for t in (study, hardware) if t)
    return f"{head}\n{what}" if head else what


def _ranked_amount(r: Row, by: str) -> str:
    """The amount a cost or time ranking orders by, for a label (tokens/s is there already):
    ranked by cost, labels of tokens/s alone did not explain the order."""
    if by == "cost":
        return f", {amount_text(r['cost_usd'])} $"
    if by == "time":
        return f", {amount_text(r['time_to_train_s'] / 86400)} days"
    return ""


# bars the top-layouts figure holds: 1,500 made a PNG 74,000 pixels tall in 19 s
MAX_BARS = 50


def plot_top_layouts(
    rows: Sequence[Row], path: Path, *, by: str = "tokens", k: int = TOP_K, study: str = ""
) -> Path:
    """Horizontal stacked bars: the best ``k`` layouts' step time by part, as many as the
    report's table lists (`--top`; the figure drew 12 beside a table of 10), at most
    `MAX_BARS` (the title says so when the table lists more)."""
    ranked = rank(rows, by)
    top = ranked[: min(k, MAX_BARS)][::-1]
    unit, scale = time_unit(max(r["iteration_s"] for r in top))
    fig, ax = plt.subplots(figsize=(11, 0.45 * max(4, len(top)) + 1.5))
    labels = [
        f"{r['context']}  {layout_label(r)}  ({r['tokens_per_s']:,.0f} tok/s, "
        f"bubble {r['bubble_fraction'] or 0.0:.1%}{_ranked_amount(r, by)})"
        for r in top
    ]
    _stack_parts(ax, labels, top, scale)
    ax.set_xlabel(
        f"step time, {unit}: the critical path's compute, exposed communication and optimizer "
        "(bubble: a GPU's mean idle share)"
    )
    what = f"Top {len(top)} layouts by {RANKING_NAMES[by]} (best at the top)"
    if min(k, len(ranked)) > len(top):
        what += f"; the report lists {min(k, len(ranked))}, a figure at most {MAX_BARS}"
    what += _unranked_note(rows, by)
    ax.set_title(titled(rows, what, study))
    # a fixed 40 points below the axes, under the tick labels and the x label: a fraction of
    # the axes' height lay over the x label when few layouts made the axes short
    below = offset_copy(ax.transAxes, fig=fig, y=-40, units="points")
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, fontsize=8, ncol=8
    )
    ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def _stack_parts(ax: Axes, labels: list[str], top: Sequence[Row], scale: float) -> None:
    """One horizontal bar per layout, its step time's parts (`_breakdown_s`) stacked left to
    right in `PARTS` order; a part no layout has gets no legend entry."""
    left = [0.0] * len(top)
    for part, color in zip(PARTS, COLORS, strict=True):
        widths = [_breakdown_s(r)[part] * scale for r in top]
        if any(w > 0 for w in widths):
            ax.barh(labels, widths, left=left, color=color, label=PART_NAMES[part])
            left = [a + b for a, b in zip(left, widths, strict=True)]


def _unranked_note(rows: Sequence[Row], by: str) -> str:
    """A title line naming the options whose layouts lack the ranking's column (no price
    under --rank cost), "" when none do: they are not among the bars, and without it a partly
    priced study's figure reads as if they lost."""
    need = lacking_column(by)
    lacking = {c for c, (short, _) in unranked_contexts(rows, by).items() if short == need}
    left_out = sorted({r["option"] for r in rows if r["context"] in lacking})
    return f"\n{', '.join(left_out)} not ranked: {need}" if left_out else ""


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not beaten on both less memory and more throughput."""
    front: list[tuple[float, float]] = []
    for mem, tps in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or tps > front[-1][1]:
            front.append((mem, tps))
    return front


def plot_pareto(rows: Sequence[Row], path: Path, *, by: str = "tokens", study: str = "") -> Path:
    """Throughput against memory per GPU, per context: screened (small), simulated (ringed),
    and each context's Pareto front of its simulated layouts (most tokens/s for the memory).
    A front is per context: one front over all of them traced only the largest, fastest
    cluster's layouts, as if a smaller cluster's were no trade-off at all."""
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    sim = rank(rows, "tokens")
    scr = [r for r in rows if r["status"] == "ok" and r["tier"] == "screen"]
    for i, ctx in enumerate(sorted({r["context"] for r in rows}, key=_context_order)):
        color = f"C{i % 10}"
        mine = [r for r in scr if r["context"] == ctx]
        xs = [r["memory_gib_per_gpu"] for r in mine]
        ax.scatter(xs, [r["screen_tokens_per_s"] for r in mine], s=5, c=color, alpha=0.35)
        mine = [r for r in sim if r["context"] == ctx]
        xs = [r["memory_gib_per_gpu"] for r in mine]
        ys = [r["tokens_per_s"] for r in mine]
        ax.scatter(xs, ys, s=22, c=color, edgecolors="k", linewidths=0.6, label=ctx)
        front = _pareto(list(zip(xs, ys, strict=True)))
        if front:
            ax.step(*zip(*front, strict=True), where="post", color=color, lw=1.2)
    ax.plot(
        [], [], color="k", lw=1.2, label="Pareto front of the simulated layouts (each its color)"
    )
    ax.set_xlabel("peak memory per GPU, GiB")
    ax.set_ylabel("tokens/s")
    whole_numbers(ax.yaxis)
    what = "Throughput vs memory (faint: screened in closed form; ringed: simulated)"
    ax.set_title(titled(rows, what, study))
    # beside the axes: inside, the six contexts of the procurement study hid screened points
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def _context_order(ctx: str) -> tuple[str, int]:
    option, _, n = ctx.rpartition("@")
    return option, int(n) if n.isdigit() else 0


def plot_scaling(rows: Sequence[Row], path: Path, *, by: str = "tokens", study: str = "") -> Path:
    """Best simulated tokens/s against GPU count, one line per cluster option."""
    fig, ax = plt.subplots(figsize=(9.5, 5))
    best = best_per_context(rows, "tokens")
    labels: list[Annotation] = []
    for option in sorted({r["option"] for r in best}):
        mine = sorted((r for r in best if r["option"] == option), key=lambda r: r["num_gpus"])
        xs = [r["num_gpus"] for r in mine]
        (line,) = ax.plot(xs, [r["tokens_per_s"] for r in mine], marker="o", label=option)
        if len(xs) > 1:  # one size: a legend entry for a line of one point, not drawn
            ideal = [mine[0]["tokens_per_s"] * x / xs[0] for x in xs]
            ax.plot(xs, ideal, ls="--", lw=0.8, color=line.get_color(), label=f"{option}: linear")
        for r in mine:
            # the report tables' MFU text (a whole percent read 50% beside the table's 50.3%)
            mfu = ax.annotate(
                f"MFU {r['mfu']:.1%}",
                (r["num_gpus"], r["tokens_per_s"]),
                textcoords="offset points",
                xytext=(6, 0),
                va="center",
                fontsize=7,
            )
            labels.append(mfu)
    ax.set_xscale("log", base=2)
    # room beside the first and last sizes, where no line runs, for their labels
    ax.margins(x=0.15, y=0.08)
    sizes = sorted({r["num_gpus"] for r in best})
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("best tokens/s")
    whole_numbers(ax.yaxis)
    ax.set_title(titled(rows, "Scaling: best layout at each cluster size", study))
    # beside the axes: inside, it covered the lines or the labels of the smallest size
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    # off the lines, markers and each other: right of a point they lay across the lines
    # leaving it, and the largest size's ran past the axes' right edge
    place_labels(fig, labels)
    return save_figure(fig, path)


def plot_procurement(
    rows: Sequence[Row], path: Path, *, by: str = "tokens", study: str = ""
) -> Path:
    """Per option and size, its best layout's time to train, cost and energy (the panels the
    rows can fill: without a token budget, tokens/s only). An option without a price or
    power has no bar in that panel and says so (it was drawn as a bar of zero); so does an
    option and size without a ranked layout (`unranked_contexts`: it was left out)."""
    entries = procurement_entries(rows, by)
    panels = procurement_panels(entries)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1.5, 5), squeeze=False)
    for i, (ax, panel) in enumerate(zip(axes[0], panels, strict=True)):
        draw_panel(ax, panel, entries)
        if i:
            ax.set_yticks([])
    what = f"Cluster options, best first by {RANKING_NAMES[by]}: the best layout of each"
    front, beaten = cost_time_front(rows)
    if len(front) + len(beaten) > 1:  # the trade-off the report's Notes name
        on = {r["context"] for r in front}
        for tick in axes[0][0].get_yticklabels():
            tick.set_fontweight("bold" if tick.get_text() in on else "normal")
        what += "\nbold: the time-vs-cost Pareto front (no other option both faster and cheaper)"
    fig.suptitle(titled(rows, what, study))
    return save_figure(fig, path)


PLOTS: dict[str, Callable[..., Path]] = {
    "top_layouts": plot_top_layouts,
    "pareto": plot_pareto,
    "scaling": plot_scaling,
    "procurement": plot_procurement,
}


def plot_all(
    rows: Sequence[Row], out_dir: Path, *, by: str = "tokens", study: str = "", top: int = TOP_K
) -> list[Path]:
    """Every figure of `PLOTS` as ``out_dir/<name>.png`` (skipped when nothing is ranked);
    ``study``, the scenario's name, heads each title; the top-layouts figure shows ``top``
    layouts, as the report's table."""
    if not rank(rows, by):
        return []
    plots: dict[str, Callable[..., Path]] = {
        **PLOTS,
        "top_layouts": partial(plot_top_layouts, k=top),
    }
    return [fn(rows, out_dir / f"{name}.png", by=by, study=study) for name, fn in plots.items()]
