"""The collector on the CPU: every op and dtype the CPU supports, resumable, budgeted."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from forecast.collect_plan import DTYPES, OPS, plan
from forecast.dataset import load_measurements
from forecast.profile import CollectConfig, collect
from simulator.cli import main


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_cpu_run_covers_every_op_and_cpu_dtype_quickly(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    t0 = time.perf_counter()
    report = collect(CollectConfig(device="cpu", out=out, warmup=1, repeats=3))
    assert time.perf_counter() - t0 < 60.0
    rows = _rows(out)
    assert {(r["OPName"], r["dtype"]) for r in rows} >= {
        (name, dt)
        for name in ("bmm", "attention", "add", "ln", "rmsnorm", "softmax", "embedding", "adam")
        for dt in ("fp32", "bf16")
    }
    assert all(float(r["Latency"]) > 0 and r["Kernel Name"] for r in rows)
    assert report.measured == len(rows) and not report.stopped_by_budget
    assert any("fp8" in u for u in report.unsupported)  # CPU: no fp8 or tf32, said so
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert {"torch", "cuda", "device_name"} <= set(meta)


def test_rerun_skips_measured_rows(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    cfg = CollectConfig(device="cpu", out=out, ops=("gemm", "softmax"), dtypes=("fp32",), repeats=2)
    first = collect(cfg)
    second = collect(cfg)
    assert second.measured == 0 and second.skipped_existing == first.measured
    assert len(_rows(out)) == first.measured


def test_budget_stops_cleanly_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    cfg = CollectConfig(device="cpu", out=out, dtypes=("fp32",), budget_s=0.0, repeats=2)
    assert collect(cfg).stopped_by_budget and not out.exists()  # nothing measured: no file
    assert not out.with_suffix(".meta.json").exists()
    done = collect(CollectConfig(device="cpu", out=out, dtypes=("fp32",), repeats=2))
    assert done.measured == len(plan(OPS, ("fp32",), "cpu"))


def test_plan_covers_every_pair_before_any_second_shape() -> None:
    jobs = plan(OPS, DTYPES, "cuda")
    first = jobs[: len(OPS) * len(DTYPES)]
    assert {(op, dt) for op, dt, _ in first} == {(op, dt) for op in OPS for dt in DTYPES}


def test_gemm_rows_load_as_bmm_measurements(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    collect(CollectConfig(device="cpu", out=out, ops=("gemm",), dtypes=("fp32",), repeats=2))
    meas = load_measurements([out])
    assert len(meas.frame) == len(_rows(out)) and set(meas.frame["family"]) == {"bmm"}


def test_cli_collect_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.csv"
    argv = ["kernels", "collect", "--device", "cpu", "--ops", "softmax", "--dtypes", "fp32,fp8"]
    assert main([*argv, "--out", str(out), "--repeats", "2"]) == 0
    text = capsys.readouterr().out
    assert "measured 2 kernels" in text and "softmax fp8" in text
    assert main(["kernels", "collect", "--device", "cpu", "--ops", "nope", "--out", "x"]) == 2
    assert main([*argv, "--out", str(out), "--repeats", "0"]) == 2
    assert main([*argv, "--out", str(out), "--budget-s", "0"]) == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--budget-s", "nan"], "--budget-s"),
        (["--ops", ",,"], "--ops: empty"),
        (["--out", "{tmp}"], "is a folder"),
        (["--out", "{tmp}/missing/c.csv"], "needs the folder"),
    ],
)
def test_cli_collect_refuses_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    argv = ["kernels", "collect", "--device", "cpu", "--out", str(tmp_path / "c.csv")]
    argv += [x.format(tmp=tmp_path) for x in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == []


def test_collect_keeps_stderr_free_of_profiler_chatter(tmp_path: Path) -> None:
    """A fresh process (Kineto reads its log level once): torch 2.13's profiler printed two
    ``USDT: profiler_start/stop`` lines per measured kernel."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "simulator", "kernels", "collect", "--device", "cpu"]
    argv += ["--ops", "gemm", "--dtypes", "fp32", "--out", str(tmp_path / "m.csv")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "measured 2 kernels" in done.stdout
    assert "USDT" not in done.stderr and "profiler_st" not in done.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--ops", "gemm", "--dtypes", "fp8"],
            "nothing could be measured (unsupported on cpu: gemm fp8",
        ),
        (["--ops", "gemm", "--dtypes", "fp32", "--budget-s", "1e-9"], "ended before the first"),
    ],
)
def test_cli_collect_that_measures_nothing_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "c.csv"
    assert main(["kernels", "collect", "--device", "cpu", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
