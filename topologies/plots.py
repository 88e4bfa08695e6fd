"""Predicted all-reduce bus bandwidth against message size, measured points overlaid."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from topologies.catalog import load_cluster
from topologies.collectives import collective_estimate
from topologies.measured import MeasuredCurve

SIZES_BYTES: tuple[float, ...] = tuple(float(2**k) for k in range(10, 34))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # one per cluster: shared lines stay apart
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def size_text(nbytes: float) -> str:
    """A power-of-two message size as "64 KiB" (the axis read 2^16 bytes)."""
    k = 0
    while nbytes >= 1024 and k < len(_BINARY) - 1:
        nbytes, k = nbytes / 1024, k + 1
    return f"{nbytes:g} {_BINARY[k]}"


def predicted_busbw(server: str, gpus: int, *, algorithm: str = "auto") -> list[float]:
    """Predicted all-reduce busbw (bytes/s) at each of `SIZES_BYTES`."""
    cluster = load_cluster(server, gpus=gpus)
    return [
        collective_estimate(
            "all-reduce", s, range(gpus), cluster, algorithm=algorithm
        ).busbw_bytes_per_s
        for s in SIZES_BYTES
    ]


def busbw_figure(clusters: Sequence[tuple[str, int]], measured: Sequence[MeasuredCurve]) -> Figure:
    """One figure: a predicted line per distinct curve, the measured points of each (server,
    gpus) in its line's colour with a marker of its own (the caller writes it:
    `simulator.figures.save_figure`). Clusters that predict the same curve share one line (the
    DGX H100's lay wholly under the HGX H200's, its legend entry naming an invisible line);
    the legend has an entry per cluster, its line and its marker, and says which share."""
    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)  # Agg backend, no pyplot global state
    ax = fig.add_subplot()
    curves: list[tuple[list[float], list[str]]] = []  # a drawn curve, the clusters on it
    handles: list[Line2D] = []
    for k, (server, gpus) in enumerate(clusters):
        algos = {c.algorithm for c in measured if (c.server, c.gpus) == (server, gpus)}
        algorithm = algos.pop() if len(algos) == 1 else "auto"
        pred = predicted_busbw(server, gpus, algorithm=algorithm)
        label = f"{server} x{gpus}"
        i = next((j for j, (ys, _) in enumerate(curves) if ys == pred), len(curves))
        colour, style = f"C{i % 10}", ("-", "--", ":", "-.")[i % 4]
        if i == len(curves):
            curves.append((pred, [label]))
            ax.plot(SIZES_BYTES, [b / 1e9 for b in pred], color=colour, ls=style)
        else:
            curves[i][1].append(label)
            label += f" (same curve as {curves[i][1][0]})"
        marker = MARKERS[k % len(MARKERS)]
        for c in measured:
            if (c.server, c.gpus) == (server, gpus):
                xs, ys = zip(*c.points, strict=True)
                ax.scatter(xs, [y / 1e9 for y in ys], color=colour, marker=marker, s=14)
        handles.append(Line2D([], [], color=colour, ls=style, marker=marker, label=label))
    _label_axes(ax)
    ax.legend(handles=handles)
    return fig


def _label_axes(ax: Axes) -> None:
    """Log-log axes of message size (powers of two, in B/KiB/MiB/GiB) and bus bandwidth."""
    ax.set_xscale("log", base=2)
    ax.set_xticks([2.0**k for k in range(10, 34, 3)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v)))
    # log: bus bandwidth spans four decades, and on a linear axis every point under 256 KiB
    # lay on zero, the latency-bound sizes unreadable
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("message size")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s, log)")
    ax.set_title("All-reduce bus bandwidth: predicted (lines) vs measured nccl-tests (points)")
    ax.grid(True, which="both", alpha=0.3)
