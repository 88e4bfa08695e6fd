"""Figure of the kernel forecaster on unseen GPUs: predicted against measured latency."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from forecast.dataset import Measurements
from forecast.evaluate import predict_rows
from forecast.predict import LatencyModel
from simulator.figures import save_figure

MARKERS = {"tile-mlp": "o", "roofline": "x"}  # one marker per model


def plot_predicted_vs_measured(
    models: dict[str, LatencyModel], meas: Measurements, out: Path
) -> Path:
    """One panel per family: measured vs predicted latency (ms, log-log), one marker per model
    and one colour per (model, GPU), the same in every panel; each legend entry carries its
    mean absolute percentage error."""
    frames = {name: predict_rows(m, meas)[0] for name, m in models.items()}
    families = sorted(set(meas.frame["family"]))
    series = [(n, str(d)) for n, f in frames.items() for d in sorted(set(f["Device"]))]
    colours = {key: plt.get_cmap("tab10")(i % 10) for i, key in enumerate(series)}
    cols = min(3, len(families))
    rows_n = -(-len(families) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 4.8 * rows_n), squeeze=False)
    for ax in axes.flat[len(families) :]:
        ax.set_axis_off()
    for ax, family in zip(axes.flat, families, strict=False):
        _draw_family(ax, family, frames, colours)
    fig.suptitle(
        "Kernel latency on GPUs absent from training (legend: mean absolute % error; "
        "o tile-mlp, x roofline)"
    )
    return save_figure(fig, out, dpi=120)


def _draw_family(
    ax: Axes,
    family: str,
    frames: dict[str, pd.DataFrame],
    colours: dict[tuple[str, str], tuple[float, float, float, float]],
) -> None:
    """One family's panel: a scatter per (model, GPU) labelled with its mean absolute
    percentage error, and the predicted = measured diagonal over the points' range."""
    lo, hi = np.inf, 0.0
    for name, frame in frames.items():
        rows: pd.DataFrame = frame[frame["family"] == family]
        for device, part in rows.groupby("Device"):
            true_ms = part["latency_s"].to_numpy() * 1e3
            pred_ms = part["pred_s"].to_numpy() * 1e3
            mape = float(np.mean(np.abs(pred_ms / true_ms - 1)) * 100)
            ax.scatter(
                true_ms,
                pred_ms,
                s=8,
                marker=MARKERS.get(name, "s"),
                color=colours[(name, str(device))],
                alpha=0.5,
                label=f"{name}, {device}: {mape:.0f}%",
            )
            lo = min(lo, true_ms.min(), pred_ms.min())
            hi = max(hi, true_ms.max(), pred_ms.max())
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
    ax.set(xscale="log", yscale="log", title=family)
    # the same range on both axes, square: each axis autoscaled to its own points, so the
    # diagonal ran at a different angle in every panel and a distance off it read unlike
    ax.set_xlim(lo / 1.5, hi * 1.5)
    ax.set_ylim(lo / 1.5, hi * 1.5)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured latency (ms)")
    ax.set_ylabel("predicted latency (ms)")
    ax.legend(fontsize=7, loc="upper left", markerscale=1.8, framealpha=0.9)
