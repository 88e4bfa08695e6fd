"""Predicted all-reduce bus bandwidth against message size, measured points overlaid."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from topologies.catalog import load_cluster
from topologies.collectives import collective_estimate
from topologies.measured import MeasuredCurve

SIZES_BYTES: tuple[float, ...] = tuple(float(2**k) for k in range(10, 34))


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
    """One figure: a predicted line per (server, gpus), measured points in the same colour
    (the caller writes it: `simulator.figures.save_figure`)."""
    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)  # Agg backend, no pyplot global state
    ax = fig.add_subplot()
    for i, (server, gpus) in enumerate(clusters):
        colour = f"C{i % 10}"
        algos = {c.algorithm for c in measured if (c.server, c.gpus) == (server, gpus)}
        algorithm = algos.pop() if len(algos) == 1 else "auto"
        pred = predicted_busbw(server, gpus, algorithm=algorithm)
        style = ("-", "--", ":", "-.")[i % 4]
        label = f"{server} x{gpus}"
        ax.plot(SIZES_BYTES, [b / 1e9 for b in pred], color=colour, ls=style, label=label)
        for c in measured:
            if (c.server, c.gpus) == (server, gpus):
                xs, ys = zip(*c.points, strict=True)
                ax.scatter(xs, [y / 1e9 for y in ys], color=colour, marker="o", s=14)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("predicted (lines) vs measured nccl-tests (points)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig
