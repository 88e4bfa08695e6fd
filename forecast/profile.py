"""The collector: times kernels with PyTorch on a GPU (or the CPU) into a measurements CSV.

The only module of the project that times a device. Nothing imports it but the CLI handler
(lazily); it imports on a CPU-only machine. Timing: warm-up calls, then the median of
repeated calls, each after an L2 flush (a write to a buffer twice the L2 size); CUDA events
on a GPU, ``perf_counter`` around a synchronised call on the CPU.

Rows carry every column of NeuSight's NVIDIA kernel tables (`forecast.dataset`):
``OPName``, ``B,M,N,K`` or ``B,H``, ``Latency`` (ms), ``Device``, ``Kernel Name``, ``Grid/Block
x,y,z``, ``Blocks/Warps per SM`` of the longest kernel the profiler saw, ``Kernels`` (every
kernel of the call, each after a ``;``) and the software versions, plus ``dtype``. ``gemm``
rows are ``bmm`` rows with ``B = 1`` (``M,N,K`` = rows, reduction, cols); ``attention`` rows
put ``BH, S_q, S_kv, D`` in ``B, M, N, K``; ``adam`` rows are ``B = 1, H = parameters``.
Re-running skips rows already in the file (a row torn by a kill is dropped first); within
``budget_s`` a kernel starts only if its first warm-up call shows the rest fits, so the run
stops cleanly with whole rows; the plan visits every (op, dtype) pair at its first shape
before any pair's second, so a short budget covers all. A shape that runs out of device
memory is skipped (reported apart, the allocator's cache emptied). ``allow_tf32`` is on for
``tf32`` rows only, and restored after each row.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
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
LAUNCH_COLUMNS = ("Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z")
# NeuSight's other columns (its NVIDIA tables), after ours so that the first 16 stay put
COLUMNS += (*LAUNCH_COLUMNS, "Warps per SM", "Blocks per SM", "Kernels")
COLUMNS += ("Torch Version", "CUDNN Version", "CUDA Version")
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}
TORCH_DTYPES["fp32"] = torch.float32
OP_NAMES = {"gemm": "bmm", "elementwise": "add", "layernorm": "ln"}
VOCAB = 50304
Fn = Callable[[], object]


class CollectError(RuntimeError):
    """An (op, dtype, shape) the device or this PyTorch build cannot run."""


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


def _rand(shape: tuple[int, ...], dtype: str, device: str) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=TORCH_DTYPES.get(dtype, torch.float32))


def _gemm_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    b, m, k, n = dims
    if dtype == "fp8":
        if device == "cpu" or b != 1 or m % 16 or n % 16 or k % 16:
            raise CollectError("fp8 needs a CUDA GPU, B = 1 and dims divisible by 16")
        a = _rand((m, k), "fp32", device).to(torch.float8_e4m3fn)
        w = _rand((n, k), "fp32", device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)  # tensor-wise scales
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
    if op in ("gemm", "bmm"):
        return _gemm_fn(dims, dtype, device)
    if op == "attention":
        return _attention_fn(dims, dtype, device)
    if op == "adam":
        return _adam_fn(dims, dtype, device)
    return _row_fn(op, dims, dtype, device)


@contextlib.contextmanager
def matmul_mode(dtype: str, device: str) -> Iterator[None]:
    """cuBLAS's TF32 switch (process-wide) on for ``tf32`` rows and off for the others while
    a row is built, timed and profiled; the caller's setting back afterwards."""
    if device == "cpu":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


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
    flush_elems = _flush_bytes(device) // 4
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


def _l2_bytes(device: str) -> int:
    if device == "cpu":
        return 1 << 20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def _flush_bytes(device: str) -> int:
    """The buffer written before each timed call: twice the L2 (120 MiB on an H200)."""
    return 2 * _l2_bytes(device)


def launch_columns(events: list[dict[str, object]], device: str) -> dict[str, object]:
    """Kernel Name, grid, block, blocks and warps per SM of the longest kernel (GPU) or
    operator (CPU) among a chrome trace's events, and ``Kernels``: every one, in order."""
    cat = "kernel" if device != "cpu" else "cpu_op"
    ours = [e for e in events if str(e.get("cat", "")).lower() == cat and "dur" in e]
    cols: dict[str, object] = dict.fromkeys(LAUNCH_COLUMNS, 0)
    cols.update({"Kernel Name": "", "Warps per SM": 0, "Blocks per SM": 0, "Kernels": ""})
    if not ours:
        return cols
    top = max(ours, key=lambda e: float(str(e["dur"])))
    args = top.get("args")
    args = args if isinstance(args, dict) else {}
    dims = [*args.get("grid", [0, 0, 0]), *args.get("block", [0, 0, 0])]
    cols.update(zip(LAUNCH_COLUMNS, (int(x) for x in dims), strict=True))
    cols["Kernel Name"] = str(top.get("name", ""))
    cols["Warps per SM"] = float(args.get("warps per SM", 0))
    cols["Blocks per SM"] = float(args.get("blocks per SM", 0))
    cols["Kernels"] = "".join(f";{e.get('name', '')}" for e in ours)  # NeuSight's form
    return cols


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


def _versions() -> dict[str, object]:
    """The row's software columns, as NeuSight's tables carry them."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "Torch Version": torch.__version__,
        "CUDNN Version": cudnn or "",
        "CUDA Version": torch.version.cuda or "",
    }


def nvidia_smi() -> dict[str, str] | None:
    """Driver, clocks (now and maximum, SM and memory) and power limit, as nvidia-smi reads
    them; None where it cannot run."""
    query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"
    query += ",power.limit,temperature.gpu"
    try:
        res = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {"query": query, "value": (res.stdout or res.stderr).strip()}


def device_metadata(device: str, cfg: CollectConfig | None = None) -> dict[str, object]:
    """GPU (or CPU) name, SMs, L2, memory, clocks, driver, torch, CUDA and cuDNN versions, and
    how the kernels are timed. ``nvidia_smi`` is read now (idle clocks); `collect` adds
    ``nvidia_smi_end``, read after the last kernel."""
    versions = _versions()
    meta: dict[str, object] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    meta["cudnn"] = versions["CUDNN Version"] or None
    if cfg is not None:
        meta["timing"] = {
            "warmup": cfg.warmup,
            "repeats": cfg.repeats,
            "statistic": "median",
            "timer": "perf_counter" if device == "cpu" else "cuda_event",
            "l2_flush_bytes": _flush_bytes(device),
        }
    if device == "cpu":
        meta.update(device_name=platform.processor() or platform.machine(), device="cpu")
        return meta
    props = torch.cuda.get_device_properties(device)
    meta.update(device_name=props.name, sms=props.multi_processor_count)
    meta.update(compute_capability=f"{props.major}.{props.minor}")
    meta.update(l2_bytes=_l2_bytes(device), total_memory_bytes=int(props.total_memory))
    meta["nvidia_smi"] = nvidia_smi()
    return meta


def row_key(op: str, dtype: str, dims: tuple[int, ...]) -> tuple[str, ...]:
    """Resume key of a row: OPName, dtype and shape columns."""
    name = OP_NAMES.get(op, op)
    return (name, dtype, *(str(d) for d in dims))


def _drop_torn_row(out: Path) -> None:
    """A run killed while writing a row leaves a last line without its newline; cut it, so
    that the next row does not land on the same line."""
    if not out.is_file() or out.stat().st_size == 0:
        return
    data = out.read_bytes()
    if not data.endswith(b"\n"):
        with out.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


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
    deadline = None if cfg.budget_s is None else t0 + cfg.budget_s
    report = CollectReport()
    _drop_torn_row(cfg.out)
    done = _existing_keys(cfg.out)
    meta = device_metadata(cfg.device, cfg)
    meta_path = cfg.out.with_suffix(".meta.json")
    write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    new_file = not cfg.out.is_file()
    versions = _versions()
    with cfg.out.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
        for op, dtype, dims in plan(cfg.ops, cfg.dtypes, cfg.device):
            if deadline is not None and time.perf_counter() >= deadline:
                report.stopped_by_budget = True
                break
            key = row_key(op, dtype, dims)
            if key in done:
                report.skipped_existing += 1
                continue
            try:
                row = _measure(cfg, op, dtype, dims, str(meta["device_name"]), deadline, report)
            except BudgetExceeded:
                report.stopped_by_budget = True
                break
            if isinstance(row, _Skip):
                (report.out_of_memory if row.oom else report.unsupported).append(row.reason)
                if row.oom:  # the failed attempt's tensors are free now; hand back the cache
                    _release_memory(cfg.device)
                continue
            writer.writerow({**row, **versions})
            f.flush()
            done.add(key)
            report.measured += 1
    report.elapsed_s = time.perf_counter() - t0
    if cfg.device != "cpu":  # clocks under load, after the last kernel
        meta["nvidia_smi_end"] = nvidia_smi()
        write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    return report


@dataclass(frozen=True)
class _Skip:
    reason: str
    oom: bool


def _release_memory(device: str) -> None:
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


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
        row = _row(op, dtype, dims, latency_s, device_name)
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
