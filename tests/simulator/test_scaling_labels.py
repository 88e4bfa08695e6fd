"""The scaling figure's text overlaps nothing: each MFU label lies inside the axes, off every
line and marker and off the other labels, and the legend lies beside the axes. The labels lay
right of their points, across the lines leaving them (and the linear-scaling lines), and the
procurement study's 512-GPU h100 and h200 labels touched."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from matplotlib.text import Annotation

import simulator.plots as plots
from simulator.rows import Row
from tests.support import drawn, simulated_row

# best tokens/s and MFU per option and size, as the shipped sweeps print them
PROCUREMENT = {
    "b200": ((512, 1_315_813, 0.550), (1024, 2_379_928, 0.497)),
    "h200": ((512, 646_867, 0.615), (1024, 1_231_685, 0.585)),
    "h100": ((512, 584_672, 0.556), (1024, 1_093_739, 0.520)),
}
GPT3_H100 = {
    "h100-sxm5-80gb": ((512, 262_000, 0.556), (1024, 504_000, 0.535), (2048, 940_000, 0.499))
}
# two options 2% apart at every size: their points and lines nearly coincide
CLOSE = {
    "h100": ((512, 262_251, 0.557), (1024, 506_742, 0.538), (2048, 947_654, 0.503)),
    "h200": ((512, 267_496, 0.557), (1024, 516_877, 0.538), (2048, 966_607, 0.503)),
}


def _rows(study: dict[str, tuple[tuple[int, float, float], ...]]) -> list[Row]:
    return [
        simulated_row(option, n, tps, mfu=mfu)
        for option, points in study.items()
        for n, tps, mfu in points
    ]


@pytest.mark.parametrize(
    "study", [PROCUREMENT, GPT3_H100, CLOSE], ids=["procurement", "gpt3", "close"]
)
def test_no_scaling_label_covers_a_line_a_marker_a_label_or_the_legend(
    monkeypatch: pytest.MonkeyPatch, study: dict[str, tuple[tuple[int, float, float], ...]]
) -> None:
    kept = drawn(monkeypatch, plots)
    plots.plot_scaling(_rows(study), Path("unused.png"))
    fig = kept[0]
    ax = fig.axes[0]
    labels = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(labels) == sum(len(points) for points in study.values())
    boxes = [t.get_window_extent() for t in labels]
    frame = ax.get_window_extent()
    for box in boxes:
        assert (
            frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        )
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    marker_px = max(line.get_markersize() for line in ax.lines) / 2 * fig.dpi / 72
    for line, box in itertools.product(ax.lines, boxes):
        path = line.get_transform().transform_path(line.get_path())
        assert not path.intersects_bbox(box.padded(marker_px), filled=False), line.get_label()
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(frame) and not any(legend.overlaps(b) for b in boxes)
