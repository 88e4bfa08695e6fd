"""The forecast benchmark scripts the README quotes still run (tiny sizes): a script that
rots is a figure nobody can re-measure. Their figures themselves are not asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_rows_monotone_prints_a_row_per_gpu_family_and_tile_count() -> None:
    lines = _run("rows_monotone.py", "--series", "2", "--gpus", "l4", "--candidates", "1,16")
    assert lines[0].split() == ["gpu", "family", "tiles", "falls>1%", "falls>5%", "largest"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("l4", f, c) for f in ("linear", "bmm") for c in ("1", "16")
    ]


def test_bandwidth_monotone_runs() -> None:
    lines = _run("bandwidth_monotone.py", "--shapes", "4", "--gpus", "l4")
    assert [line.split()[:2] for line in lines[1:3]] == [["l4", "linear"], ["l4", "bmm"]]
    assert any(line.startswith("bmm") and "slower on h200-sxm-141gb" in line for line in lines)


@pytest.mark.parametrize("gpu", ["l4", "h100-sxm5-80gb"])
def test_kernel_speed_runs(gpu: str) -> None:
    (line,) = _run("kernel_speed.py", "--n", "500", "--gpu", gpu)
    assert line.startswith("500 kernels in ") and f"on {gpu}:" in line


def test_stream_floor_prints_a_line_per_reading() -> None:
    neusight = ROOT.parent / "shared" / "data" / "neusight"
    if not (neusight / "labels").is_dir():
        pytest.skip(f"NeuSight labels not found at {neusight} (clone without ../shared)")
    lines = _run("stream_floor.py", "--data", str(neusight))
    assert [line.split(" training GPUs ")[0].strip() for line in lines] == [
        "shipped", "GEMMs - F", "GEMMs - F/2", "all - F", "all - F/2"
    ]  # fmt: skip
