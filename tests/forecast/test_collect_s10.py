"""Audit of the kernel collector's CUDA path (session 10), run here on a fake CUDA device.

No GPU here: `fake_cuda` keeps the collector's own code and swaps only the device's pieces:
``torch.cuda.Event`` becomes a timer with the CUDA event interface (``record``,
``synchronize``, ``elapsed_time`` in ms) read from the collector's own clock, tensor factories
put ``device="cuda"`` tensors on the CPU, the device properties are an H200's, and the
profiler writes a Kineto-shaped chrome trace. The last test runs the real path on a GPU.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from forecast import collect_rows, profile
from forecast.collect_plan import DTYPES, OPS, plan
from forecast.profile import CollectConfig, collect
from simulator.cli import main

ROOT = Path(__file__).resolve().parents[2]
L2_BYTES = 1 << 20  # the fake GPU's L2 (an H200 has 60 MiB; small keeps the CPU flush quick)

# A Kineto chrome trace of one call, as torch.profiler writes it with CUDA activity: kernels
# are "cat": "kernel" events whose args carry grid, block, blocks/warps per SM.
KINETO_EVENTS: list[dict[str, Any]] = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::bmm", "dur": 40.0, "args": {}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 9.0, "args": {}},
    {
        "ph": "X",
        "cat": "kernel",
        "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster1x2x1",
        "dur": 30.0,
        "args": {"grid": [66, 2, 1], "block": [384, 1, 1], "blocks per SM": 1.0},
    },
    {
        "ph": "X",
        "cat": "kernel",
        "name": "splitKreduce_kernel",
        "dur": 2.0,
        "args": {"grid": [8, 1, 1], "block": [128, 1, 1], "warps per SM": 0.24},
    },
]
KINETO_EVENTS[2]["args"]["warps per SM"] = 12.0


class FakeClock:
    """``time`` for the collector: perf_counter reads a clock that fake kernels advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class FakeProfile:
    """``torch.profiler.profile``: runs the block, writes `KINETO_EVENTS` as the trace."""

    def __init__(self, activities: list[Any]) -> None:
        assert torch.profiler.ProfilerActivity.CUDA in activities  # kernels need CUDA activity

    def __enter__(self) -> FakeProfile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps({"traceEvents": KINETO_EVENTS}))


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def made(*args: Any, device: Any = None, **kw: Any) -> torch.Tensor:
        if device is not None and str(device).startswith("cuda"):
            device = "cpu"
        return factory(*args, device=device, **kw)

    return made


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """The collector's CUDA path on the CPU; returns what the fakes saw."""
    seen = types.SimpleNamespace(empty_cache=0, syncs=0, buffers=[])
    clock = profile.time  # a test may swap profile.time for a FakeClock; events follow it

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing, "CUDA events time only with enable_timing=True"
            self.t: float | None = None

        def record(self, stream: object = None) -> None:
            self.t = profile.time.perf_counter()

        def synchronize(self) -> None:
            seen.syncs += 1

        def elapsed_time(self, end: Event) -> float:
            assert self.t is not None and end.t is not None, "elapsed_time of unrecorded events"
            return (end.t - self.t) * 1e3  # CUDA events: milliseconds

    props = types.SimpleNamespace(
        name="NVIDIA H200",
        multi_processor_count=132,
        major=9,
        minor=0,
        L2_cache_size=L2_BYTES,
        total_memory=150_754_820_096,
    )

    def empty_cache() -> None:
        seen.empty_cache += 1

    def sync(*a: object) -> None:
        seen.syncs += 1

    def empty(*args: Any, device: Any = None, **kw: Any) -> torch.Tensor:
        size = args[0] if len(args) == 1 else args
        t = torch.full((size,) if isinstance(size, int) else size, float("nan"), **kw)
        seen.buffers.append(t)
        return t

    real_empty = torch.empty
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("randn", "ones", "randint", "zeros"):
        monkeypatch.setattr(torch, name, _on_cpu(getattr(torch, name)))
    monkeypatch.setattr(torch, "empty", _on_cpu(empty))
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(subprocess, "run", _fake_smi)  # nvidia-smi
    seen.real_empty, seen.clock = real_empty, clock
    tf32 = torch.backends.cuda.matmul.allow_tf32
    yield seen
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _fake_smi(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    fields = argv[1].split("=", 1)[1].split(",")
    return subprocess.CompletedProcess(argv, 0, ", ".join(f"<{f}>" for f in fields) + "\n", "")


def _small_plan(
    monkeypatch: pytest.MonkeyPatch, jobs: list[tuple[str, str, tuple[int, ...]]]
) -> None:
    monkeypatch.setattr(profile, "plan", lambda ops, dtypes, device: list(jobs))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --- plan and resume: each (op, dtype, shape) once ------------------------------------


def test_cuda_plan_has_each_row_once() -> None:
    """The GEMM plan listed 8192^3 and 2048^3 twice (as a layer, M = tokens = hidden, and as a
    wave-edge cube): 10 jobs measured twice, 10 duplicate rows."""
    keys = [collect_rows.row_key(*job) for job in plan(OPS, DTYPES, "cuda")]
    assert len(keys) == len(set(keys))
    first = plan(OPS, DTYPES, "cuda")[: len(OPS) * len(DTYPES)]  # still every pair first
    assert {(op, dt) for op, dt, _ in first} == {(op, dt) for op in OPS for dt in DTYPES}


def test_a_job_listed_twice_is_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = ("softmax", "fp32", (64, 256))
    _small_plan(monkeypatch, [job, job])
    out = tmp_path / "m.csv"
    report = collect(CollectConfig(device="cpu", out=out, warmup=1, repeats=2))
    assert len(_rows(out)) == 1 and report.measured == 1 and report.skipped_existing == 1


def test_resume_after_a_torn_last_row_keeps_every_row_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed inside a row's write leaves a line without its newline; the resumed run
    appended its first row onto that line (one row of 32 fields, the shape of neither)."""
    out = tmp_path / "m.csv"
    cfg = CollectConfig(device="cpu", out=out, ops=("softmax",), dtypes=("fp32",), repeats=2)
    collect(cfg)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:9])  # header, row 1, a torn row 2
    report = collect(cfg)
    rows = _rows(out)
    assert report.measured == 1 and len(rows) == 2
    assert all(None not in r and float(r["Latency"]) > 0 for r in rows)
    assert [r["B"] for r in rows] == ["64", "128"]


# --- CUDA timing, tf32, fp8, flush ------------------------------------------------------


def test_cuda_timing_reads_events_after_a_written_flush(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Median of the event times; a buffer of twice the L2 is written (zeroed) before each
    timed call, not only allocated."""
    clock = FakeClock()
    monkeypatch.setattr(profile, "time", clock)
    costs = iter([1.0] * 3 + [5.0, 1.0, 2.0, 9.0, 3.0])  # 3 warm-ups, then 5 timed calls

    def fn() -> None:
        clock.now += next(costs)

    assert profile.time_s(fn, "cuda", warmup=3, repeats=5) == 3.0  # median of 5,1,2,9,3
    flush = [b for b in fake_cuda.buffers if b.numel() * b.element_size() >= 2 * L2_BYTES]
    assert len(flush) == 1 and bool((flush[0] == 0).all())  # written: no NaN left


def test_tf32_follows_the_dtype_and_is_restored(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allow_tf32`` is a process-wide switch: the collector set it per row and left it at
    the last row's value (fp32 last: off for whoever runs after it)."""
    seen: list[bool] = []
    real_bmm = torch.bmm

    def bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return real_bmm(x, y)

    monkeypatch.setattr(torch, "bmm", bmm)
    for dtype, before in (("tf32", False), ("fp32", True)):
        seen.clear()
        torch.backends.cuda.matmul.allow_tf32 = before
        _small_plan(monkeypatch, [("gemm", dtype, (1, 32, 32, 32))])
        out = tmp_path / f"{dtype}.csv"
        assert collect(CollectConfig(device="cuda", out=out, warmup=1, repeats=2)).measured == 1
        assert seen == [dtype == "tf32"] * 4  # 1 warm-up, 2 timed, 1 profiled: all in its mode
        assert torch.backends.cuda.matmul.allow_tf32 is before


def test_fp8_gemm_meets_scaled_mm_layout(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch._scaled_mm on CUDA: mat1 row-major, mat2 column-major, every dim a multiple of
    16, float32 one-element scales on the same device, a 16-bit out_dtype."""
    calls: list[tuple[int, int, int]] = []

    def scaled_mm(
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        out_dtype: torch.dtype,
        **kw: Any,
    ) -> torch.Tensor:
        assert a.dtype == b.dtype == torch.float8_e4m3fn
        assert a.stride(1) == 1 and b.stride(0) == 1  # row-major A, column-major B
        assert all(d % 16 == 0 for d in (*a.shape, *b.shape)) and a.shape[1] == b.shape[0]
        for s in (scale_a, scale_b):
            assert s.dtype == torch.float32 and s.numel() == 1 and s.device == a.device
        assert out_dtype in (torch.bfloat16, torch.float16)
        calls.append((a.shape[0], a.shape[1], b.shape[1]))
        return (a.float() @ b.float()).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    _small_plan(monkeypatch, [("gemm", "fp8", (1, 64, 32, 48)), ("gemm", "fp8", (1, 65, 32, 48))])
    report = collect(CollectConfig(device="cuda", out=tmp_path / "m.csv", warmup=1, repeats=2))
    assert report.measured == 1 and set(calls) == {(64, 32, 48)}  # M, reduction, N
    assert len(report.unsupported) == 1 and "divisible by 16" in report.unsupported[0]


# --- profiler, metadata, schema ---------------------------------------------------------


def test_profiler_columns_come_from_the_longest_kernel(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernel Name, launch grid and block, blocks and warps per SM (NeuSight's columns) from
    the longest ``kernel`` event; ``Kernels`` lists every kernel of the call, NeuSight-style."""
    _small_plan(monkeypatch, [("gemm", "bf16", (1, 64, 64, 64))])
    out = tmp_path / "m.csv"
    collect(CollectConfig(device="cuda", out=out, warmup=1, repeats=2))
    (row,) = _rows(out)
    assert row["Kernel Name"] == KINETO_EVENTS[2]["name"]
    grid_block = [row[f"{w} {a}"] for w in ("Grid", "Block") for a in "xyz"]
    assert grid_block == ["66", "2", "1", "384", "1", "1"]
    assert float(row["Blocks per SM"]) == 1.0 and float(row["Warps per SM"]) == 12.0
    assert row["Kernels"] == f";{KINETO_EVENTS[2]['name']};splitKreduce_kernel"
    assert row["Device"] == "NVIDIA H200" and row["dtype"] == "bf16"
    assert row["Torch Version"] == torch.__version__
    assert not list(tmp_path.glob("*.trace.json"))  # the trace is not left beside the CSV


def test_schema_is_neusights_plus_dtype(tmp_path: Path) -> None:
    """Every column of a NeuSight NVIDIA bmm table (but the upstream trainer's ``large``) and
    of its vector tables, plus ``dtype`` and ``H``."""
    neusight_bmm = (
        "OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,"
        "Blocks per SM,Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,Kernels,B,M,N,K"
    )  # header of shared/data/neusight/kernels/nvidia/train/bmm/*.csv.gz
    assert set(neusight_bmm.split(",")) | {"dtype", "H"} == set(collect_rows.COLUMNS)


def test_a_profiler_failure_keeps_the_timed_row(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(FakeProfile):
        def __enter__(self) -> FakeProfile:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(torch.profiler, "profile", Broken)
    _small_plan(monkeypatch, [("softmax", "bf16", (64, 256))])
    out = tmp_path / "m.csv"
    report = collect(CollectConfig(device="cuda", out=out, warmup=1, repeats=2))
    (row,) = _rows(out)
    assert report.measured == 1 and row["Kernel Name"] == "" and float(row["Latency"]) > 0
    assert report.profiler_errors and "CUPTI" in report.profiler_errors[0]


def test_gpu_metadata(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Name, SMs, L2, memory, cuDNN, versions, the timing method, and nvidia-smi's clocks
    read both before (idle) and after the kernels (under load)."""
    _small_plan(monkeypatch, [("softmax", "bf16", (64, 256))])
    out = tmp_path / "m.csv"
    collect(CollectConfig(device="cuda", out=out, warmup=2, repeats=7))
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["device_name"] == "NVIDIA H200" and meta["sms"] == 132
    assert meta["compute_capability"] == "9.0" and meta["l2_bytes"] == L2_BYTES
    assert meta["total_memory_bytes"] == 150_754_820_096
    assert {"torch", "cuda", "cudnn"} <= set(meta)
    assert meta["timing"]["warmup"] == 2 and meta["timing"]["repeats"] == 7
    assert meta["timing"]["l2_flush_bytes"] == 2 * L2_BYTES
    for when in ("nvidia_smi", "nvidia_smi_end"):
        query = meta[when]["query"].split(",")
        assert {"driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem"} <= set(query)
        assert "clocks.max.mem" in query and meta[when]["value"].count("<") == len(query)


# --- out of memory and the budget -------------------------------------------------------


def test_out_of_memory_is_skipped_and_the_cache_emptied(
    fake_cuda: types.SimpleNamespace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The largest bmm shapes outgrow an H200 (32768 x 2048 x 2048 outputs: 256 GiB in
    bf16); their OOM was reported as 'unsupported here: bmm bf16' (as if bf16 bmm could not
    run) and the allocator kept its cached blocks."""
    real_bmm = torch.bmm

    def bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 GiB")
        return real_bmm(x, y)

    monkeypatch.setattr(torch, "bmm", bmm)
    _small_plan(monkeypatch, [("bmm", "bf16", (8, 32, 16, 32)), ("bmm", "bf16", (4, 32, 16, 32))])
    argv = ["kernels", "collect", "--device", "cuda", "--out", str(tmp_path / "m.csv")]
    assert main([*argv, "--repeats", "2"]) == 0
    text = capsys.readouterr().out
    assert [r["B"] for r in _rows(tmp_path / "m.csv")] == ["4"]
    assert fake_cuda.empty_cache >= 1
    assert "out of memory (skipped): bmm bf16 (8, 32, 16, 32)" in text
    assert "unsupported here (op dtype): none" in text


def test_budget_stops_before_a_kernel_that_would_overrun(
    fake_cuda: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget was checked only between kernels: a kernel begun 1 s before the deadline
    ran all its calls (3 warm-ups + 10 timed + 1 profiled, 14 s at 1 s each): 28 s for a
    20 s budget. It now stops after the first warm-up call shows the rest will not fit."""
    clock = FakeClock()
    monkeypatch.setattr(profile, "time", clock)
    real_bmm = torch.bmm

    def bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        clock.now += 1.0
        return real_bmm(x, y)

    monkeypatch.setattr(torch, "bmm", bmm)
    _small_plan(monkeypatch, [("gemm", "bf16", (1, 16 * i, 16, 16)) for i in (1, 2, 3)])
    out = tmp_path / "m.csv"
    report = collect(CollectConfig(device="cuda", out=out, budget_s=20.0))
    assert report.stopped_by_budget and report.measured == 1 and len(_rows(out)) == 1
    assert report.elapsed_s <= 20.0  # 14 s for the first, 1 s of the second's warm-up
    again = collect(CollectConfig(device="cuda", out=out))  # resumes with the second
    assert again.measured == 2 and again.skipped_existing == 1 and len(_rows(out)) == 3


# --- the device script --------------------------------------------------------------------


def test_device_script_runs_the_collector_on_the_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu_collect.sh with DEVICE=cpu: the CSV, its metadata and the log under OUT,
    (the CPU plan ends well inside its budget)."""
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "DEVICE": "cpu", "BUDGET_S": "30"}
    env["PYTHON"] = sys.executable
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_collect.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    names = {p.name for p in tmp_path.iterdir()}
    csv_name = next(n for n in names if n.endswith(".csv"))
    assert {csv_name, csv_name.replace(".csv", ".meta.json"), "collect.log"} == names
    assert _rows(tmp_path / csv_name) and "kernels" in (tmp_path / "collect.log").read_text()


# --- the real CUDA path (a GPU machine; never in CI) -------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_collects_every_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs: list[tuple[str, str, tuple[int, ...]]] = [
        ("gemm", dt, (1, 256, 256, 256)) for dt in DTYPES
    ]
    jobs += [("attention", "bf16", (8, 256, 256, 64)), ("softmax", "bf16", (256, 1024))]
    _small_plan(monkeypatch, jobs)
    out = tmp_path / "m.csv"
    report = collect(CollectConfig(device="cuda", out=out))
    rows = _rows(out)
    assert report.measured == len(jobs) == len(rows), report
    assert all(r["Kernel Name"] and int(r["Grid x"]) > 0 for r in rows)
    assert "flash" in next(r for r in rows if r["OPName"] == "attention")["Kernel Name"]
