"""What every figure of tilesim does last: lay out, write the PNG, free the figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def save_figure(fig: plt.Figure, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder made if needed) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
