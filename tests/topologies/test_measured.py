"""The model against measured nccl-tests all-reduce busbw (read from ../shared at run time)."""

from __future__ import annotations

from pathlib import Path

from topologies.measured import compare, load_measured
from topologies.plots import plot_busbw


def test_busbw_within_15_percent_1mib_to_8gib(hardware_dir: Path) -> None:
    curves = load_measured(hardware_dir)
    assert {c.server for c in curves} >= {"dgx-a100", "dgx-h100", "hgx-h200", "gb200-nvl72"}
    bad = [
        f"{r.server} x{r.gpus} {r.nbytes:.3g} B: {r.error:+.1%}"
        for c in curves
        for r in compare(c)
        if 2**20 <= r.nbytes <= 2**33 and abs(r.error) > 0.15
    ]
    assert not bad, bad


def test_small_message_latency_within_2x(hardware_dir: Path) -> None:
    for c in load_measured(hardware_dir):
        for r in compare(c):
            if r.nbytes <= 64 * 2**10 and r.measured_busbw_bytes_per_s >= 0.05e9:
                ratio = r.predicted_busbw_bytes_per_s / r.measured_busbw_bytes_per_s
                assert 0.5 <= ratio <= 2.0, (r.server, r.nbytes, ratio)


def test_plot_writes_png(hardware_dir: Path, tmp_path: Path) -> None:
    curves = load_measured(hardware_dir)
    out = plot_busbw([("dgx-a100", 8), ("hgx-h200", 8)], curves, tmp_path / "busbw.png")
    assert out.stat().st_size > 1000
