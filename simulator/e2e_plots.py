"""Figure of whole-model forecasts against the NeuSight labels (``tilesim validate e2e --plot``).

Left: our forecast against each run's measured time. Right: each run's own per-op trace,
summed, against the same measured time: how close an exact op-by-op forecast could come.
One colour per GPU, circles for inference, triangles for training, crosses for
``torch.compile``d inference (left only: those runs have no trace); the band is ±12%.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulator.e2e import FITTED
from simulator.e2e_validate import PreparedRun, predicted_e2e_ms
from simulator.figures import save_figure

BAND = 0.12  # the whole-model target's largest error


def plot_e2e(runs: list[PreparedRun], out: Path, compiled: list[PreparedRun] | None = None) -> Path:
    """Draw the two panels for ``runs`` (one latency model) into ``out``, and the
    ``compiled`` runs' forecasts in the left one."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    compiled = compiled or []
    gpus = sorted({p.label.gpu_id for p in runs + compiled})
    cmap = plt.get_cmap("tab10")
    colours = {gpu: cmap(i % 10) for i, gpu in enumerate(gpus)}
    panels = (
        ("forecast (tile-mlp)", lambda p: predicted_e2e_ms(p, FITTED)),
        ("sum of the run's own per-op trace", lambda p: p.label.trace_ms),
    )
    values = [p.label.e2e_ms for p in runs]
    for ax, (title, value) in zip(axes, panels, strict=True):
        for gpu in gpus:
            for mode, marker in (("inf", "o"), ("train", "^")):
                sel = [p for p in runs if p.label.gpu_id == gpu and p.label.run.mode == mode]
                pairs = [(p.label.e2e_ms, value(p)) for p in sel if value(p) is not None]
                if not pairs:
                    continue
                x, y = np.array(pairs, dtype=np.float64).T
                values += list(y)
                ax.scatter(x, y, s=18, marker=marker, color=colours[gpu], label=f"{gpu} {mode}")
        ax.set(xscale="log", yscale="log", title=title, xlabel="measured e2e (ms)")
    for gpu in sorted({p.label.gpu_id for p in compiled}):
        sel = [p for p in compiled if p.label.gpu_id == gpu]
        x = np.array([p.label.e2e_ms for p in sel])
        y = np.array([predicted_e2e_ms(p, FITTED) for p in sel])
        values += list(x) + list(y)
        axes[0].scatter(x, y, s=24, marker="x", color=colours[gpu], label=f"{gpu} compiled")
    lo, hi = min(values) / 1.3, max(values) * 1.3
    line = np.array([lo, hi])
    for ax in axes:
        ax.plot(line, line, color="black", lw=0.8)
        for f in (1 - BAND, 1 + BAND):
            ax.plot(line, line * f, color="grey", lw=0.6, ls="--")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    axes[0].set_ylabel("predicted or summed (ms)")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].legend(handles, labels, fontsize=7, loc="upper left", ncol=2)
    fig.suptitle("Whole models on one GPU against the NeuSight labels (dashed: ±12%)")
    return save_figure(fig, out)
