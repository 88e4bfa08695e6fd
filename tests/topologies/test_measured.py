"""The model against measured nccl-tests all-reduce busbw (read from ../shared at run time)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.figures import save_figure
from topologies import TopologyError
from topologies.measured import compare, load_measured
from topologies.plots import busbw_figure


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
    fig = busbw_figure([("dgx-a100", 8), ("hgx-h200", 8)], curves)
    out = save_figure(fig, tmp_path / "busbw.png")
    assert out.stat().st_size > 1000


BENCH = [
    {
        "system": "synthetic 8x A100",
        "gpu": "a100-sxm4-80gb",
        "nccl_allreduce_8gpu": [
            {"size_label": "1M", "bytes_approx": 2**20, "busbw_GBps": 36.0},
            {"size_label": "1G", "bytes_approx": 2**30, "busbw_GBps": 228.0},
        ],
    }
]
TABLE = """# collectives

### 5.1 Single node, all-reduce

| Message | A100 | H100 | H200 | GB200 |
|---|---|---|---|---|
| 1 MB | 36.22 | 43.70 | 52.96 | 80.48 |
| 1 GB | 228.10 | 466.35 | 467.58 | 646.87 |

### 5.2 Next
"""


def _write(folder: Path, bench: object = None, table: str = TABLE) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "microbenchmarks.json").write_text(json.dumps(BENCH if bench is None else bench))
    (folder / "collectives.md").write_text(table)
    return folder


def _bench_with(**point: object) -> list[dict[str, object]]:
    rec = copy.deepcopy(BENCH[0])
    rec["nccl_allreduce_8gpu"][1].update(point)  # type: ignore[index]
    return [rec]


def test_synthetic_data_loads(tmp_path: Path) -> None:
    curves = load_measured(_write(tmp_path))
    assert {c.server for c in curves} == {"dgx-a100", "dgx-h100", "hgx-h200", "gb200-nvl72"}
    assert all(len(c.points) == 2 for c in curves)


@pytest.mark.parametrize(
    ("bench", "table", "needle"),
    [
        (_bench_with(busbw_GBps=0), TABLE, "nccl_allreduce_8gpu[1] busbw_GBps"),  # ZeroDivision
        (_bench_with(busbw_GBps=float("nan")), TABLE, "busbw_GBps must be a positive finite"),
        (_bench_with(bytes_approx="8K"), TABLE, 'positive finite number, got "8K"'),
        (_bench_with(busbw_GBps=None), TABLE, "busbw_GBps"),
        ([{"gpu": "a100-sxm4-80gb", "nccl_allreduce_8gpu": [{"bytes_approx": 1024}]}], TABLE,
         "busbw_GBps must be a positive finite number, got nothing"),
        (None, TABLE.replace("| 43.70 |", "| n/a |"), "row 1 MB, dgx-h100 x8 cell"),
        (None, TABLE.replace("| 43.70 |", "| nan |"), "row 1 MB, dgx-h100 x8 cell"),
        (None, TABLE.replace("| 80.48 |", "|"), "row 1 MB: 3 busbw cells, expected 4"),
        (None, TABLE.replace("### 5.1", "### 5.9"), "no section '### 5.1'"),
    ],
)  # fmt: skip
def test_broken_measured_data_names_the_file_and_entry(
    tmp_path: Path, bench: object, table: str, needle: str
) -> None:
    folder = _write(tmp_path, bench, table)
    with pytest.raises(TopologyError) as excinfo:
        load_measured(folder)
    message = str(excinfo.value)
    assert needle in message and str(folder) in message and "\n" not in message


def test_truncated_or_directory_data_files_name_the_file(tmp_path: Path) -> None:
    folder = _write(tmp_path)
    bench = folder / "microbenchmarks.json"
    bench.write_text(bench.read_text()[:40])
    with pytest.raises(TopologyError, match=r"cannot read measured data .*microbenchmarks\.json"):
        load_measured(folder)
    bench.unlink()
    bench.mkdir()
    with pytest.raises(TopologyError, match=r"cannot read measured data .*microbenchmarks\.json"):
        load_measured(folder)


@pytest.mark.parametrize("cmd", ["collective-check", "collective-plot"])
def test_cli_broken_data_is_one_line_exit_2(
    tmp_path: Path, cmd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _write(tmp_path / "hw", _bench_with(busbw_GBps=0))
    out = tmp_path / "busbw.png"
    argv = [cmd, "--data", str(folder)] + (["--min-bytes", "0"] if "check" in cmd else [])
    assert main(argv + (["--out", str(out)] if "plot" in cmd else [])) == 2
    captured = capsys.readouterr()
    assert "busbw_GBps" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not out.exists()


def test_published_size_labels_read_as_the_powers_of_two_nccl_tests_ran(tmp_path: Path) -> None:
    """ "33M" is 2^25 bytes in decimal units; ``bytes_approx`` holds 33 x 2^20 (3% over)."""
    bench = _bench_with(size_label="33M", bytes_approx=33 * 2**20)
    bench[0]["nccl_allreduce_8gpu"][0].update(size_label="65K", bytes_approx=65 * 2**10)  # type: ignore[index]
    (curve,) = [
        c
        for c in load_measured(_write(tmp_path / "hw", bench))
        if c.server == "dgx-a100" and c.source.startswith("microbenchmarks")
    ]
    assert [n for n, _ in curve.points] == [2.0**16, 2.0**25]
