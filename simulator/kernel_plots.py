"""Figure of the kernel forecaster on unseen GPUs: predicted against measured latency."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from forecast.dataset import Measurements
from forecast.evaluate import predict_rows
from forecast.predict import LatencyModel
from simulator.figures import save_figure


def plot_predicted_vs_measured(
    models: dict[str, LatencyModel], meas: Measurements, out: Path
) -> Path:
    """One panel per family: measured vs predicted seconds, one colour per (model, device)."""
    frames = {name: predict_rows(m, meas)[0] for name, m in models.items()}
    families = sorted(set(meas.frame["family"]))
    cols = min(3, len(families))
    rows_n = -(-len(families) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 4.6 * rows_n), squeeze=False)
    for ax in axes.flat[len(families) :]:
        ax.set_axis_off()
    for ax, family in zip(axes.flat, families, strict=False):
        lo, hi = np.inf, 0.0
        for name, frame in frames.items():
            rows: pd.DataFrame = frame[frame["family"] == family]
            for device, part in rows.groupby("Device"):
                true_ms = part["latency_s"].to_numpy() * 1e3
                pred_ms = part["pred_s"].to_numpy() * 1e3
                mape = float(np.mean(np.abs(pred_ms / true_ms - 1)) * 100)
                marker = "o" if name == "tile-mlp" else "x"
                ax.scatter(
                    true_ms,
                    pred_ms,
                    s=6,
                    marker=marker,
                    alpha=0.5,
                    label=f"{name} {device} ({mape:.0f}%)",
                )
                lo = min(lo, true_ms.min(), pred_ms.min())
                hi = max(hi, true_ms.max(), pred_ms.max())
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set(xscale="log", yscale="log", title=family, xlabel="measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Kernel forecasts on GPUs absent from training (MAPE in brackets)")
    return save_figure(fig, out, dpi=120)
