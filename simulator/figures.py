"""What every figure of tilesim does last: lay out, write the PNG, free the figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from simulator.errors import ConfigError

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.backend_bases import FigureCanvasBase


def save_figure(fig: plt.Figure, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder made if needed) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def figure_path(path: Path, flag: str) -> Path:
    """``path`` if a figure can be written there (checked before any work): a file name whose
    suffix matplotlib writes (.png, .pdf, .svg, ...), not an existing folder."""
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name such as {path / 'fig.png'}")
    if path.suffix.lstrip(".").lower() not in formats:
        raise ConfigError(
            f"{flag} {path}: give a file name ending in one of "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    return path
