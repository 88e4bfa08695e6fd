"""Figure of a serving forecast (``tilesim serve --plot FILE``).

Left: time per output token against output tokens per second over batch sizes (powers of
two up to the largest batch that fits, and the requested one): the latency a user sees
against what the GPUs deliver. Right: the requested batch's decode pass time against the context
it attends over (the sampled passes), the prefill's time in the title (at ``--gen 1``, with no
decode pass, a note saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.text import Annotation
from matplotlib.ticker import LogLocator, NullFormatter

from simulator.figures import place_labels, save_figure, short_numbers
from simulator.serve import PassTimes, ServeResult
from simulator.serve_request import ServeRequest

MAX_PLOTTED_BATCH = 4096


def plot_batches(request: ServeRequest, max_batch: int) -> list[int]:
    """Batches drawn on the left: powers of two up to the largest that fits (at most
    `MAX_PLOTTED_BATCH`), that largest one, and the requested one."""
    top = min(max(max_batch, 1), MAX_PLOTTED_BATCH)
    powers = [2**i for i in range(top.bit_length()) if 2**i <= top]
    return sorted({*powers, top, request.batch})


def plot_serve(
    request: ServeRequest,
    title: str,
    curve: PassTimes,
    by_batch: Callable[[int], ServeResult],
    max_batch: int,
    out: Path,
) -> Path:
    """Draw the two panels (module docstring) into ``out``; ``by_batch(b)`` forecasts the
    request at batch ``b``."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6))
    batches = plot_batches(request, max_batch)
    labels = _draw_batches(left, request, batches, [by_batch(b) for b in batches])
    _draw_passes(right, request, curve)
    fig.suptitle(title)
    place_labels(fig, labels)  # the fastest batch's label ran past the right edge
    return save_figure(fig, out)


def _draw_batches(
    ax: Axes, request: ServeRequest, batches: list[int], results: list[ServeResult]
) -> list[Annotation]:
    """The left panel: time per output token (prefill at ``--gen 1``) against output tokens/s,
    one labelled point per batch (the requested one in bold); returns the labels."""
    x = [r.output_tokens_per_s for r in results]
    y = [r.tpot_ms if request.gen > 1 else r.prefill_ms for r in results]
    ax.plot(x, y, marker="o", color="tab:blue", lw=1)
    labels: list[Annotation] = []
    for b, xi, yi, r in zip(batches, x, y, results, strict=True):
        mark = "" if r.fits else " (does not fit)"
        weight = "bold" if b == request.batch else "normal"
        label = ax.annotate(
            f"b={b}{mark}",
            (xi, yi),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
            fontweight=weight,
        )
        labels.append(label)
    gpus = "1 GPU" if request.tp == 1 else f"all {request.tp} GPUs"
    per = "time per output token" if request.gen > 1 else "prefill"
    ax.set(
        xscale="log",
        xlabel=f"output tokens/s ({gpus})",
        ylabel=f"{per} (ms)",
        title="latency against throughput, by batch",
    )
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    short_numbers(ax.xaxis)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.12, y=0.08)
    ax.grid(alpha=0.3)
    return labels


def _draw_passes(ax: Axes, request: ServeRequest, curve: PassTimes) -> None:
    """The right panel: each decode pass's time against its context, the prefill's in the
    title; at ``--gen 1`` (no decode pass) a note saying so."""
    ms = [t * 1e3 for t in curve.seconds]
    if len(ms) > 1:
        ax.plot(curve.contexts[1:], ms[1:], color="tab:orange", lw=1.5, marker=".", ms=3)
        # room above the longest pass: the autoscaled top sat on it and cut its markers
        ax.set_ylim(0, max(ms[1:]) * 1.08 or None)
        ax.set(
            xlabel="context (tokens each sequence attends over)",
            ylabel="decode pass (ms)",
            title=f"batch {request.batch}: decode passes; prefill {ms[0]:,.1f} ms",
        )
        ax.grid(alpha=0.3)
    else:  # --gen 1: the prefill makes the one token; an empty 0-1 frame said nothing
        ax.set_axis_off()
        ax.set_title(f"batch {request.batch}: prefill {ms[0]:,.1f} ms")
        ax.text(
            0.5,
            0.5,
            f"no decode pass: the prefill ({ms[0]:,.1f} ms)\ngenerates the only token",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
