"""The collector: times kernels with PyTorch on a GPU (or the CPU) into a measurements CSV.

The only module of the project that times a device. Nothing imports it but the CLI handler
(lazily); it imports on a CPU-only machine. Timing: warm-up calls, then the median of
repeated calls, each after an L2 flush (a write to a buffer twice the L2 size); CUDA events
on a GPU, ``perf_counter`` around a synchronised call on the CPU.

Rows carry every column of NeuSight's NVIDIA kernel tables (`forecast.collect_rows`); the
kernels are `forecast.collect_kernels`'s, the metadata file `forecast.collect_device`'s.
Re-running skips rows already in the file (a row torn by a kill is dropped first); within
``budget_s`` a kernel starts only if its first warm-up call shows the rest fits, so the run
stops cleanly with whole rows; the plan visits every (op, dtype) pair at its first shape
before any pair's second, so a short budget covers all. A shape that runs out of device
memory is skipped (reported apart, the allocator's cache emptied). ``allow_tf32`` is on for
``tf32`` rows only, and restored after each row.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import torch

from forecast.collect_device import device_metadata, flush_bytes, nvidia_smi, software_versions
from forecast.collect_kernels import CollectError, Fn, build_fn, matmul_mode
from forecast.collect_plan import DTYPES, OPS, plan
from forecast.collect_rows import COLUMNS, build_row, launch_columns, resume_keys, row_key
from forecast.dataset import DataError
from forecast.files import write_text_atomic


class BudgetExceeded(Exception):  # noqa: N818 (a stop, not a failure)
    """The kernel being timed would run past the collection's deadline."""


@dataclass(frozen=True)
class CollectConfig:
    """What to measure, where, and for how long."""

    device: str
    out: Path
    ops: tuple[str, ...] = OPS
    dtypes: tuple[str, ...] = DTYPES
    budget_s: float | None = None
    warmup: int = 3
    repeats: int = 10


@dataclass
class CollectReport:
    """Outcome of one collection run."""

    measured: int = 0
    skipped_existing: int = 0
    unsupported: list[str] = field(default_factory=list)
    out_of_memory: list[str] = field(default_factory=list)
    profiler_errors: list[str] = field(default_factory=list)
    stopped_by_budget: bool = False
    elapsed_s: float = 0.0


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def time_s(
    fn: Fn, device: str, *, warmup: int, repeats: int, deadline: float | None = None
) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` calls, L2 flushed before each.

    With a ``deadline`` (``time.perf_counter`` seconds) each warm-up call is timed and a
    `BudgetExceeded` raised as soon as the calls left (warm-ups, timed calls and the
    profiler's one) at that call's time would end past it."""
    flush_elems = flush_bytes(device) // 4
    scratch = torch.empty(flush_elems, device=device, dtype=torch.float32)
    calls_left = warmup + repeats + 1  # + the profiler's call (`launch_info`)
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        calls_left -= 1
        now = time.perf_counter()
        if deadline is not None and now + (now - t0) * calls_left > deadline:
            raise BudgetExceeded
    _sync(device)
    times = []
    for _ in range(repeats):
        scratch.zero_()
        if device == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def launch_info(fn: Fn, device: str) -> dict[str, object]:
    """`launch_columns` of one profiled call (the profiler's chrome trace, in a temporary
    folder so that a kill leaves none beside the CSV)."""
    # Kineto, the profiler's backend, prints two "USDT: profiler_start/stop" lines to stderr
    # per profiled call (torch 2.13) at every log level up to 5; it reads this when it starts.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device != "cpu":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        _sync(device)
    with tempfile.TemporaryDirectory(prefix="tilesim-trace-") as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    return launch_columns(events, device)


def collect(cfg: CollectConfig) -> CollectReport:
    """Measure every planned (op, dtype, shape) not already in ``cfg.out``, within budget."""
    if cfg.out.suffix.lower() != ".csv":  # rows are plain text: a .csv.gz was unreadable
        raise DataError(f"--out {cfg.out}: the collector writes plain CSV; give a .csv path")
    t0 = time.perf_counter()
    deadline = None if cfg.budget_s is None else t0 + cfg.budget_s
    report = CollectReport()
    done = resume_keys(cfg.out)
    meta = device_metadata(cfg.device, cfg)
    meta_path = cfg.out.with_suffix(".meta.json")
    new_file = not cfg.out.is_file()
    versions = software_versions()
    with ExitStack() as files:
        opened: list[tuple[TextIO, csv.DictWriter[str]]] = []

        def write(row: dict[str, object]) -> None:
            if not opened:  # the files appear with the first row: a run that measures nothing
                write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")  # writes none
                fresh = files.enter_context(cfg.out.open("a", newline=""))
                opened.append((fresh, csv.DictWriter(fresh, fieldnames=COLUMNS)))
                if new_file:
                    opened[0][1].writeheader()
            f, writer = opened[0]
            writer.writerow({**row, **versions})
            f.flush()

        device_name = str(meta["device_name"])
        _measure_plan(cfg, report, write, done=done, device_name=device_name, deadline=deadline)
    report.elapsed_s = time.perf_counter() - t0
    if cfg.device != "cpu" and opened:  # clocks under load, after the last kernel
        meta["nvidia_smi_end"] = nvidia_smi()
        write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    return report


def _measure_plan(
    cfg: CollectConfig,
    report: CollectReport,
    write: Callable[[dict[str, object]], None],
    *,
    done: set[tuple[str, ...]],
    device_name: str,
    deadline: float | None,
) -> None:
    """Measure the planned kernels not in ``done``, in plan order, each row to ``write``,
    until the plan ends or the ``deadline`` passes (``report`` counts and says which)."""
    for op, dtype, dims in plan(cfg.ops, cfg.dtypes, cfg.device):
        if deadline is not None and time.perf_counter() >= deadline:
            report.stopped_by_budget = True
            return
        key = row_key(op, dtype, dims)
        if key in done:
            report.skipped_existing += 1
            continue
        try:
            row = _measure(cfg, op, dtype, dims, device_name, deadline, report)
        except BudgetExceeded:
            report.stopped_by_budget = True
            return
        if isinstance(row, _Skip):
            _note_skip(row, report, cfg.device)
            continue
        write(row)
        done.add(key)
        report.measured += 1


@dataclass(frozen=True)
class _Skip:
    reason: str
    oom: bool


def _release_memory(device: str) -> None:
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


def _note_skip(skip: _Skip, report: CollectReport, device: str) -> None:
    (report.out_of_memory if skip.oom else report.unsupported).append(skip.reason)
    if skip.oom:  # the failed attempt's tensors are free now; hand back the cache
        _release_memory(device)


def _measure(
    cfg: CollectConfig,
    op: str,
    dtype: str,
    dims: tuple[int, ...],
    device_name: str,
    deadline: float | None = None,
    report: CollectReport | None = None,
) -> dict[str, object] | _Skip:
    """One row, or why this (op, dtype, shape) cannot run here (out of memory apart); a
    `BudgetExceeded` from `time_s` passes through. A profiler failure keeps the timed row
    (without its kernel columns) and is noted in ``report.profiler_errors``."""
    label = f"{op} {dtype} {dims}"
    with matmul_mode(dtype, cfg.device):
        try:
            fn = build_fn(op, dtype, dims, cfg.device)
            latency_s = time_s(
                fn, cfg.device, warmup=cfg.warmup, repeats=cfg.repeats, deadline=deadline
            )
        except torch.cuda.OutOfMemoryError as e:
            return _Skip(f"{label}: {_first_line(e)}", oom=True)
        except (CollectError, RuntimeError, TypeError, NotImplementedError) as e:
            return _Skip(f"{label}: {_first_line(e)}", oom=False)
        row = build_row(op, dtype, dims, latency_s, device_name)
        try:
            row.update(launch_info(fn, cfg.device))
        except (RuntimeError, OSError, ValueError) as e:  # the timing stands without them
            row.update(launch_columns([], cfg.device))
            if report is not None:
                report.profiler_errors.append(f"{label}: {_first_line(e)}")
    del fn
    return row


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
