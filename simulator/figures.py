"""What every figure of tilesim does last: lay out, write the file, free the figure. The same
figure gives the same bytes in every format: no date (SVG, PDF, PostScript; a gzip time for
SVGZ), SVG ids from a fixed salt instead of random ones."""

from __future__ import annotations

import gzip
import io
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

from forecast.files import write_atomic
from simulator.errors import ConfigError, check_writable_above

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from matplotlib.text import Annotation

# dates matplotlib would stamp, per format (PostScript reads SOURCE_DATE_EPOCH instead)
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}


@contextmanager
def _reproducible(fmt: str) -> Iterator[None]:
    """Fixed SVG ids, and PostScript's date at the epoch, while one figure is written."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if fmt in ("ps", "eps"):
        os.environ["SOURCE_DATE_EPOCH"] = epoch or "0"
    try:
        with plt.rc_context({"svg.hashsalt": "tilesim"}):
            yield
    finally:
        if epoch is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)


def _write(fig: Figure, tmp: Path, fmt: str, dpi: int) -> None:
    kind = "svg" if fmt == "svgz" else fmt
    buf = io.BytesIO()
    with _reproducible(kind):
        meta: dict[str, Any] = {"metadata": _NO_DATE[kind]} if kind in _NO_DATE else {}
        fig.savefig(buf, dpi=dpi, bbox_inches="tight", format=kind, **meta)
    data = buf.getvalue()
    tmp.write_bytes(gzip.compress(data, mtime=0) if fmt == "svgz" else data)


def place_labels(fig: Figure, labels: list[Annotation]) -> None:
    """Move point labels (each offset in points from its point) so that each lies inside its
    axes and none covers another: one past the right (top) edge goes to the left of (below) its
    point, and of two that overlap in one axes the upper moves up clear of the lower. Measured
    on the laid-out figure, which `save_figure` lays out the same way again."""
    fig.tight_layout()
    for t in labels:
        if t.axes is None:
            continue
        frame, box = t.axes.get_window_extent(), t.get_window_extent()
        dx, dy = t.xyann
        if box.x1 > frame.x1:
            t.set_horizontalalignment("right")
            dx = -abs(dx)
        if box.y1 > frame.y1:
            t.set_verticalalignment("top")
            dy = -abs(dy)
        t.xyann = (dx, dy)
    points_per_px = 72.0 / fig.dpi
    placed: list[Annotation] = []
    for t in sorted(labels, key=lambda t: t.get_window_extent().y0):
        for other in placed:
            box, below = t.get_window_extent(), other.get_window_extent()
            if other.axes is t.axes and box.overlaps(below):
                dx, dy = t.xyann
                t.xyann = (dx, dy + (below.y1 - box.y0 + 1.0) * points_per_px)
        placed.append(t)


def save_figure(fig: Figure, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` whole or not at all (its folder made if needed) and close it;
    a path that cannot be written is a `ConfigError` naming it."""
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fmt = path.suffix.lstrip(".").lower()
        write_atomic(path, lambda tmp: _write(fig, tmp, fmt, dpi))
    except OSError as e:
        raise ConfigError(f"cannot write the figure {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def figure_path(path: Path, flag: str) -> Path:
    """``path`` if a figure can be written there (checked before any work): a file name whose
    suffix matplotlib writes (.png, .pdf, .svg, ...; .pgf only with its TeX system installed),
    not an existing folder, under a folder that exists or can be made (the nearest existing one
    is a writable folder)."""
    # PGF runs its TeX system to measure text: without one a .pgf figure was a traceback
    tex = matplotlib.rcParams["pgf.texsystem"]
    formats = [
        f for f in FigureCanvasBase.get_supported_filetypes() if f != "pgf" or shutil.which(tex)
    ]
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name such as {path / 'fig.png'}")
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ConfigError(
            f"{flag} {path}: "
            + (f".pgf needs {tex}, which is not installed; " if suffix == "pgf" else "")
            + "give a file name ending in one of "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    check_writable_above(path.parent, f"{flag} {path}")
    return path
