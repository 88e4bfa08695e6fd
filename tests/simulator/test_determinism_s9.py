"""Same sweep, same bytes: every file a sweep writes is identical run to run, under another
hash seed, after an interrupt and resume (rows logged in another order, as Ray returns them),
on Ray, and when `tilesim plot` redraws the figures; rows.csv holds what rows.jsonl holds."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.rows import PROGRESS, PROGRESS_META
from simulator.space import find_scenario

TINY = find_scenario("tiny-gpt-8gpu")
# Three candidates and none per cluster: most layouts keep their screen row, whose
# micro-batch and graph-node counts are null.
ARGS = ("--candidates", "3", "--per-context", "0")
ROOT = Path(__file__).resolve().parents[2]


def _sweep(out: Path, *extra: str) -> int:
    return main(["sweep", str(TINY), "--no-progress", "--out", str(out), *ARGS, *extra])


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _same_files(out: Path, fresh: Path) -> None:
    got, want = _files(out), _files(fresh)
    assert sorted(got) == sorted(want)
    assert [n for n in want if got[n] != want[n]] == []


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fresh") / "out"
    assert _sweep(out, "--serial") == 0
    return out


def test_rows_csv_holds_the_jsonl_values_exactly(fresh: Path) -> None:
    """Every cell of rows.csv is the text of its rows.jsonl value: floats at full precision,
    whole numbers whole. The micro-batch and graph-node counts, null in screen rows, were
    written as floats ("8.0") in a sweep with screen rows and whole ("8") in one without."""
    rows = [json.loads(line) for line in (fresh / "rows.jsonl").open()]
    with (fresh / "rows.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert any(r["num_micro_batches"] is None for r in rows)  # the case: screen rows
    assert any(isinstance(r["num_micro_batches"], int) for r in rows)
    for row, cells in zip(rows, table, strict=True):
        assert set(cells) == set(row) - {"error"}
        for k, cell in cells.items():
            v = row[k]
            want = "" if v is None else repr(v) if isinstance(v, float) else str(v)
            assert (k, cell) == (k, want)
            if isinstance(v, float):
                assert float(cell) == v  # repr round-trips


def test_a_resumed_log_in_arrival_order_leaves_the_fresh_bytes(fresh: Path, tmp_path: Path) -> None:
    """An interrupted sweep whose log holds its rows in the order they arrived (here the
    reverse of the serial order, as Ray workers can return them) and lost the rest, resumed:
    every file equals the fresh run's, the log too (it used to keep the arrival order)."""
    lines = (fresh / PROGRESS).read_text().splitlines(keepends=True)
    out = tmp_path / "out"
    out.mkdir()
    kept = lines[::-1][: len(lines) * 2 // 3]
    (out / PROGRESS).write_text("".join(kept) + lines[0][:50])  # and a torn last line
    shutil.copy(fresh / PROGRESS_META, out / PROGRESS_META)
    assert _sweep(out, "--serial") == 0
    _same_files(out, fresh)
    logged = (out / PROGRESS).read_text().splitlines(keepends=True)
    assert logged == lines
    order = [(json.loads(x)["tier"] != "screen", json.loads(x)["key"]) for x in logged]
    assert order == sorted(order)  # screen rows then simulated ones, each by key


def test_a_rerun_of_a_finished_sweep_and_other_top_leave_the_rows(
    fresh: Path, tmp_path: Path
) -> None:
    """Rerunning the finished sweep (all rows resumed) rewrites the same bytes; --top changes
    the report's table, the top-layouts figure (as many layouts) and the --top recorded for
    `tilesim plot` only."""
    out = tmp_path / "out"
    shutil.copytree(fresh, out)
    assert _sweep(out, "--serial") == 0
    _same_files(out, fresh)
    assert _sweep(out, "--serial", "--top", "2") == 0
    changed = [n for n, b in _files(out).items() if b != _files(fresh)[n]]
    assert changed == ["report.md", "scenario.resolved.json", "top_layouts.png"]
    assert "## Top 2\n" in (out / "report.md").read_text()


def test_another_hash_seed_writes_the_same_bytes(fresh: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    cmd = [sys.executable, "-m", "simulator", "sweep", str(TINY), "--serial", "--no-progress"]
    done = subprocess.run(
        [*cmd, "--out", str(out), *ARGS], env=env, cwd=ROOT, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    _same_files(out, fresh)


def test_plot_redraws_the_sweeps_figure_bytes(fresh: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(fresh, out)
    for png in out.glob("*.png"):
        png.unlink()
    assert main(["plot", str(out)]) == 0
    _same_files(out, fresh)


@pytest.mark.ray
def test_ray_with_two_workers_writes_the_serial_bytes(fresh: Path, tmp_path: Path) -> None:
    """Ray returns chunks in the order they finish; the log was left in that order."""
    out = tmp_path / "out"
    assert _sweep(out, "--workers", "2") == 0
    _same_files(out, fresh)


@pytest.mark.parametrize("suffix", ["svg", "svgz", "pdf", "eps", "png"])
def test_the_same_figure_gives_the_same_bytes_in_every_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """No date, no random SVG id: the same figure drawn at two moments writes equal files (the
    clock is moved a day between them, as two runs a day apart would see it)."""
    import time

    import matplotlib.pyplot as plt

    from simulator.figures import save_figure

    def draw(name: str) -> bytes:
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2], label="a")
        ax.set_title("same figure")
        ax.legend()
        return save_figure(fig, tmp_path / f"{name}.{suffix}").read_bytes()

    first = draw("a")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 86400.0)
    assert draw("b") == first
