"""The collector: times kernels with PyTorch on a GPU (or the CPU) into a measurements CSV.

The only module of the project that times a device. Nothing imports it but the CLI handler
(lazily); it imports on a CPU-only machine. Timing: warm-up calls, then the median of
repeated calls, each after an L2 flush (a write to a buffer twice the L2 size); CUDA events
on a GPU, ``perf_counter`` around a synchronised call on the CPU.

Rows follow the NeuSight schema (`forecast.dataset`): ``OPName``, ``B,M,N,K`` or ``B,H``,
``Latency`` (ms), ``Device``, plus ``dtype``, ``Kernel Name`` and ``Grid/Block x,y,z`` of
the longest kernel the profiler saw. ``gemm`` rows are ``bmm`` rows with ``B = 1``
(``M,N,K`` = rows, reduction, cols); ``attention`` rows put ``BH, S_q, S_kv, D`` in
``B, M, N, K``; ``adam`` rows are ``B = 1, H = parameters``. Re-running skips rows already
in the file; ``budget_s`` stops cleanly between kernels; the plan visits every
(op, dtype) pair at its first shape before any pair's second, so a short budget covers all.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from forecast.collect_plan import DTYPES, OPS, plan
from forecast.files import write_text_atomic

COLUMNS: tuple[str, ...] = (
    "OPName",
    "B",
    "M",
    "N",
    "K",
    "H",
    "Latency",
    "Device",
    "dtype",
    "Kernel Name",
)
COLUMNS += ("Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z")
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}
TORCH_DTYPES["fp32"] = torch.float32
OP_NAMES = {"gemm": "bmm", "elementwise": "add", "layernorm": "ln"}
VOCAB = 50304
Fn = Callable[[], object]


class CollectError(RuntimeError):
    """An (op, dtype, shape) the device or this PyTorch build cannot run."""


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
    stopped_by_budget: bool = False
    elapsed_s: float = 0.0


def _rand(shape: tuple[int, ...], dtype: str, device: str) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=TORCH_DTYPES.get(dtype, torch.float32))


def _gemm_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    b, m, k, n = dims
    if dtype == "fp8":
        if device == "cpu" or b != 1 or m % 16 or n % 16 or k % 16:
            raise CollectError("fp8 needs a CUDA GPU, B = 1 and dims divisible by 16")
        a = _rand((m, k), "fp32", device).to(torch.float8_e4m3fn)
        w = _rand((n, k), "fp32", device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    x, y = _rand((b, m, k), dtype, device), _rand((b, k, n), dtype, device)
    return lambda: torch.bmm(x, y)


def _attention_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    bh, sq, skv, d = dims
    q, k, v = (_rand((1, bh, s, d), dtype, device) for s in (sq, skv, skv))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v)


def _row_fn(op: str, dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    b, h = dims
    x = _rand((b, h), dtype, device)
    f = torch.nn.functional
    if op == "elementwise":
        y = _rand((b, h), dtype, device)
        return lambda: x + y
    if op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op == "layernorm":
        return lambda: f.layer_norm(x, (h,))
    if op == "rmsnorm":
        return lambda: f.rms_norm(x, (h,))
    table = _rand((VOCAB, h), dtype, device)
    ids = torch.randint(0, VOCAB, (b,), device=device)
    return lambda: f.embedding(ids, table)


def _adam_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    p = torch.nn.Parameter(_rand((dims[0] * dims[1],), dtype, device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(
        [p], lr=1e-3, fused=device != "cpu", foreach=False if device == "cpu" else None
    )
    return opt.step


def build_fn(op: str, dtype: str, dims: tuple[int, ...], device: str) -> Fn:
    """A zero-argument callable that launches one kernel of ``op`` (a `CollectError` if not)."""
    if dtype == "tf32" and (device == "cpu" or op not in ("gemm", "bmm", "attention")):
        raise CollectError("tf32 is a CUDA tensor-core mode of matmuls")
    if dtype == "fp8" and op != "gemm":
        raise CollectError("fp8 is collected for gemm (torch._scaled_mm) only")
    if device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    if op in ("gemm", "bmm"):
        return _gemm_fn(dims, dtype, device)
    if op == "attention":
        return _attention_fn(dims, dtype, device)
    if op == "adam":
        return _adam_fn(dims, dtype, device)
    return _row_fn(op, dims, dtype, device)


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def time_s(fn: Fn, device: str, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` calls, L2 flushed before each."""
    flush_elems = 2 * _l2_bytes(device) // 4
    scratch = torch.empty(flush_elems, device=device, dtype=torch.float32)
    for _ in range(warmup):
        fn()
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


def _l2_bytes(device: str) -> int:
    if device == "cpu":
        return 1 << 20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def launch_info(fn: Fn, device: str, trace: Path) -> tuple[str, list[int]]:
    """Name and grid/block dims of the longest kernel (GPU) or operator (CPU) of one call."""
    # Kineto, the profiler's backend, prints two "USDT: profiler_start/stop" lines to stderr
    # per profiled call (torch 2.13) at every log level up to 5; it reads this when it starts.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device != "cpu":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        _sync(device)
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text()).get("traceEvents", [])
    trace.unlink(missing_ok=True)
    cat = "kernel" if device != "cpu" else "cpu_op"
    ours = [e for e in events if e.get("cat") == cat and "dur" in e]
    if not ours:
        return "", [0] * 6
    top = max(ours, key=lambda e: float(e["dur"]))
    args = top.get("args", {})
    dims = [*args.get("grid", [0, 0, 0]), *args.get("block", [0, 0, 0])]
    return str(top.get("name", "")), [int(x) for x in dims]


def device_metadata(device: str) -> dict[str, object]:
    """GPU (or CPU) name, clocks, driver, torch and CUDA versions."""
    meta: dict[str, object] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cpu":
        meta.update(device_name=platform.processor() or platform.machine(), device="cpu")
        return meta
    props = torch.cuda.get_device_properties(device)
    meta.update(device_name=props.name, sms=props.multi_processor_count)
    meta.update(compute_capability=f"{props.major}.{props.minor}")
    try:
        import subprocess

        query = "name,driver_version,clocks.max.sm,clocks.sm,clocks.mem,power.limit"
        res = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        meta["nvidia_smi"] = {"query": query, "value": res.stdout.strip()}
    except (OSError, subprocess.SubprocessError):
        meta["nvidia_smi"] = None
    return meta


def row_key(op: str, dtype: str, dims: tuple[int, ...]) -> tuple[str, ...]:
    """Resume key of a row: OPName, dtype and shape columns."""
    name = OP_NAMES.get(op, op)
    return (name, dtype, *(str(d) for d in dims))


def _existing_keys(out: Path) -> set[tuple[str, ...]]:
    if not out.is_file():
        return set()
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    keys = set()
    for r in rows:
        shape = [r["B"], r["H"]] if r.get("H") else [r[c] for c in ("B", "M", "N", "K")]
        keys.add((r["OPName"], r["dtype"], *shape))
    return keys


def _row(
    op: str, dtype: str, dims: tuple[int, ...], latency_s: float, device_name: str
) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    cols = ("B", "M", "N", "K") if len(dims) == 4 else ("B", "H")
    row.update(zip(cols, dims, strict=True))
    row.update(OPName=OP_NAMES.get(op, op), dtype=dtype, Device=device_name)
    row["Latency"] = latency_s * 1e3  # NeuSight schema: milliseconds
    return row


def collect(cfg: CollectConfig) -> CollectReport:
    """Measure every planned (op, dtype, shape) not already in ``cfg.out``, within budget."""
    t0 = time.perf_counter()
    report = CollectReport()
    done = _existing_keys(cfg.out)
    meta = device_metadata(cfg.device)
    write_text_atomic(cfg.out.with_suffix(".meta.json"), json.dumps(meta, indent=2) + "\n")
    new_file = not cfg.out.is_file()
    with cfg.out.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
        for op, dtype, dims in plan(cfg.ops, cfg.dtypes, cfg.device):
            if cfg.budget_s is not None and time.perf_counter() - t0 >= cfg.budget_s:
                report.stopped_by_budget = True
                break
            if row_key(op, dtype, dims) in done:
                report.skipped_existing += 1
                continue
            row = _measure(cfg, op, dtype, dims, str(meta["device_name"]))
            if isinstance(row, str):
                report.unsupported.append(row)
                continue
            writer.writerow(row)
            f.flush()
            report.measured += 1
    report.elapsed_s = time.perf_counter() - t0
    return report


def _measure(
    cfg: CollectConfig, op: str, dtype: str, dims: tuple[int, ...], device_name: str
) -> dict[str, object] | str:
    """One row, or a one-line reason why this (op, dtype, shape) cannot run here."""
    try:
        fn = build_fn(op, dtype, dims, cfg.device)
        latency_s = time_s(fn, cfg.device, warmup=cfg.warmup, repeats=cfg.repeats)
        name, launch = launch_info(fn, cfg.device, cfg.out.with_suffix(".trace.json"))
    except (CollectError, RuntimeError, TypeError, NotImplementedError) as e:
        return f"{op} {dtype} {dims}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    row = _row(op, dtype, dims, latency_s, device_name)
    row["Kernel Name"] = name
    row.update(zip(COLUMNS[-6:], launch, strict=True))
    del fn
    return row
