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
from typing import Any, Literal, cast

import matplotlib

from forecast.files import write_atomic
from simulator.errors import ConfigError, check_writable_above, refuse_special_file

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from matplotlib.path import Path as MplPath
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import Bbox

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


_HAlign = Literal["left", "center", "right"]
_VAlign = Literal["bottom", "center", "top"]
_Spot = tuple[tuple[float, float], _HAlign, _VAlign]  # offset in points and the alignment

# Where a point label may go, in order of preference after the caller's own offset: a unit
# direction from the point and the text's alignment there (right, left, above, below, then
# the diagonals), each tried at growing distances (points).
_SIDES: tuple[tuple[int, int, _HAlign, _VAlign], ...] = (
    (1, 0, "left", "center"),
    (-1, 0, "right", "center"),
    (0, 1, "center", "bottom"),
    (0, -1, "center", "top"),
    (1, 1, "left", "bottom"),
    (1, -1, "left", "top"),
    (-1, 1, "right", "bottom"),
    (-1, -1, "right", "top"),
)
_DISTANCES_PT = (5.0, 10.0, 18.0, 28.0)


def _spots(t: Annotation) -> list[_Spot]:
    own = cast(_Spot, (t.xyann, t.get_horizontalalignment(), t.get_verticalalignment()))
    others = [((dx * d, dy * d), ha, va) for d in _DISTANCES_PT for dx, dy, ha, va in _SIDES]
    return [own, *others]


def _obstacles(ax: Axes) -> tuple[list[MplPath], list[Bbox]]:
    """The drawn lines of ``ax`` in pixels, and the boxes of its legend and the figure's."""
    paths = [
        line.get_transform().transform_path(line.get_path())
        for line in ax.get_lines()
        if line.get_visible()
    ]
    legends = [lg for lg in (ax.get_legend(), *ax.figure.legends) if lg is not None]
    return paths, [lg.get_window_extent() for lg in legends]


def _clashes(box: Bbox, frame: Bbox, near: tuple[list[MplPath], list[Bbox]], pad: float) -> int:
    """How badly a label's box sits: past the axes' edge worst, then over another label or a
    legend, then across a line or a marker (``pad``: a marker's radius, in pixels)."""
    paths, boxes = near
    inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    padded = box.padded(pad)
    crossed = sum(p.intersects_bbox(padded, filled=False) for p in paths)
    return (0 if inside else 1000) + 100 * sum(box.overlaps(b) for b in boxes) + crossed


def place_labels(fig: Figure, labels: list[Annotation]) -> None:
    """Move point labels (each offset in points from its point) so that none covers another
    label, a line, a marker or a legend, and each lies inside its axes: each takes the first
    clear spot around its point (its own offset first, then right, left, above, below and the
    diagonals, near to far), else the least crowded one. Measured on the laid-out figure, which
    `save_figure` lays out the same way again; the scaling figure's MFU labels lay across the
    linear-scaling lines and on each other."""
    fig.tight_layout()
    placed: list[Bbox] = []
    for t in labels:
        ax = t.axes
        if not isinstance(ax, Axes):
            continue
        frame, (paths, legends) = ax.get_window_extent(), _obstacles(ax)
        pad = max((ln.get_markersize() for ln in ax.get_lines()), default=0.0) / 2 * fig.dpi / 72
        best: tuple[int, int, _Spot] | None = None
        for i, spot in enumerate(_spots(t)):
            _put(t, spot)
            score = _clashes(t.get_window_extent(), frame, (paths, [*legends, *placed]), pad)
            if best is None or score < best[0]:
                best = (score, i, spot)
            if score == 0:
                break
        if best is not None:
            _put(t, best[2])
            placed.append(t.get_window_extent())


def _put(t: Annotation, spot: _Spot) -> None:
    offset, ha, va = spot
    t.xyann = offset
    t.set_horizontalalignment(ha)
    t.set_verticalalignment(va)


def whole_numbers(axis: Axis) -> None:
    """Tick labels as whole numbers with thousands separators: tokens/s axes read 0.8 ... 1.6
    under a lone "1e7" in the corner, or 900000 without separators."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def short_numbers(axis: Axis) -> None:
    """Tick labels with k and M for a horizontal log axis, where whole numbers ran into each
    other ("1,000,0002,000,000" under `tilesim serve --plot`'s throughput axis)."""

    def text(v: float, _: object) -> str:
        for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:g}{suffix}"
        return f"{v:g}"

    axis.set_major_formatter(FuncFormatter(text))


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
    refuse_special_file(path, flag)
    check_writable_above(path.parent, f"{flag} {path}")
    return path
