"""Calibration of the tensor-core model on measurements only (`../shared/data/hardware`).

`calibrate` fits the few constants of `forecast.tensor_core.TCParams` on published cuBLASLt
GEMM and flash-attention throughput, keeping one GPU out to test on; `validation_rows` prints
measured against predicted. H100 records are never read: the H100 is the project's blind GPU.

The flash-attention figures are forward + backward: Azure's AI-benchmarking-guide runs
flash-attention's ``benchmarks/benchmark_flash_attention.py`` (non-causal, fp16, model dim
2048, so heads = 2048 / head dim) and reports its ``fwd + bwd`` column, whose FLOPs are
3.5 x the forward's ``4 B S^2 H D`` (the backward counts 2.5 x). A case is therefore the two
kernels, and its TFLOP/s is their FLOPs over their summed time.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import forecast
from forecast.files import read_json
from forecast.gpus import gpu_id_for_device, load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.tensor_core import F64, TCParams, TensorCoreError, TensorCoreModel, save_params

DEFAULT_DATA_DIR = Path(forecast.__file__).resolve().parents[2] / "shared" / "data" / "hardware"
BLIND_GPU = "h100"  # never calibrated on, tuned to or reported as validation
FA_BENCH_MODEL_DIM = 2048  # flash-attention's benchmark script: heads = 2048 / head_dim
FITTED = {
    "level": (0.4, 1.0),
    "launch_s": (0.5e-6, 15e-6),
    "tile_overhead_cycles": (0.0, 8000.0),
    "small_tile_penalty": (0.0, 1.0),
    "overlap_exponent": (1.0, 8.0),
}
FA_FITTED = {"fa_efficiency": (0.3, 2.0)}


@dataclass(frozen=True)
class Case:
    """One measurement: GPU id, the kernels timed together, achieved TFLOP/s, a short label."""

    gpu_id: str
    kernels: tuple[KernelSpec, ...]
    measured_tflops: float
    label: str
    source: str = "microbenchmarks.json"

    @property
    def family(self) -> OpFamily:
        """Op family of the case's kernels."""
        return self.kernels[0].family

    @property
    def flops(self) -> float:
        """FLOPs of all the case's kernels."""
        return sum(k.flops() for k in self.kernels)


def _positive(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):  # "could not convert string to float" named no field
        v = math.nan
    if not 0 < v < math.inf:
        raise ValueError(f"{what} must be a positive number, got {value!r}")
    return v


def _record_cases(rec: dict[str, Any]) -> tuple[list[Case], float | None]:
    """The cases of one GPU's record, and its HBM stream efficiency (None if not measured)."""
    gpu_id = str(rec["gpu"])
    cases: list[Case] = []
    for g in rec.get("gemm_cublaslt", []):
        m, n, k = int(g["m"]), int(g["n"]), int(g["k"])
        kernel = KernelSpec(OpFamily.BMM, (1, m, k, n), Dtype(g["dtype"]))  # reduce k
        tflops = _positive(g["tflops"], "gemm tflops")
        cases.append(Case(gpu_id, (kernel,), tflops, f"gemm {m}x{n}x{k}"))
    fa = rec.get("flash_attention_2")
    if fa:
        hd, seq = int(fa["head_dim"]), int(fa["seq_len"])
        bh = int(fa["batch"]) * FA_BENCH_MODEL_DIM // hd
        pair = tuple(
            KernelSpec(OpFamily.ATTENTION, (bh, seq, seq, hd), Dtype.FP16, op)
            for op in ("attention", "attention_bwd")
        )
        label = f"fa2 fwd+bwd d{hd} s{seq} bh{bh}"
        cases.append(Case(gpu_id, pair, _positive(fa["tflops"], "flash_attention_2 tflops"), label))
    stream = rec.get("hbm_stream_TBps", {}).get("triad")
    hbm = _positive(stream, "hbm_stream_TBps.triad") * 1e12 if stream else None
    return cases, (hbm / load_gpu(gpu_id).hbm_bw_bytes_per_s if hbm else None)


def benchmark_cases(data_dir: Path = DEFAULT_DATA_DIR) -> tuple[list[Case], dict[str, float]]:
    """GEMM and flash-attention cases of microbenchmarks.json, and HBM efficiency per GPU; a
    `TensorCoreError` naming the file for one that cannot be read or holds no such case."""
    path, fix = data_dir / "microbenchmarks.json", "pass --data <shared>/data/hardware"
    records = read_json(path, TensorCoreError, "microbenchmarks JSON", fix)
    if not isinstance(records, list):
        raise TensorCoreError(f"{path}: expected a JSON list of one object per GPU; {fix}")
    cases: list[Case] = []
    hbm: dict[str, float] = {}
    for i, rec in enumerate(records):
        try:
            if BLIND_GPU in str(rec["gpu"]).lower():
                continue
            mine, efficiency = _record_cases(rec)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            why = f"lacks {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
            raise TensorCoreError(f"{path}: record {i}: {why}; {fix}") from None
        cases += mine
        if efficiency is not None:
            hbm[str(rec["gpu"])] = efficiency
    if not cases:
        raise TensorCoreError(f"{path}: no gemm_cublaslt or flash_attention_2 measurement; {fix}")
    return cases, hbm


TC_DTYPES = ("tf32", "fp16", "bf16", "fp8")
FA2_FORWARD_KERNEL = "flash_fwd"  # FA2's forward kernels: flash_fwd_kernel, flash_fwd_splitkv_...


def _collected_case(r: dict[str, str], source: str) -> Case | None:
    """One row of a collected CSV as a case: tensor-core GEMMs (``bmm``) and flash-attention-2
    forwards (``attention`` rows whose kernel is FA2's; PyTorch may run another backend);
    None for the collector's other rows (FP32, memory-bound ops)."""
    op, dtype = r.get("OPName", ""), r.get("dtype", "")
    if dtype not in TC_DTYPES or op not in ("bmm", "attention"):
        return None
    if op == "attention" and FA2_FORWARD_KERNEL not in r.get("Kernel Name", ""):
        return None
    gpu_id = gpu_id_for_device(r.get("Device", ""))
    if BLIND_GPU in gpu_id:
        raise ValueError("an H100 measurement; the H100 is the project's blind GPU")
    dims = tuple(int(_positive(r[c], f"column {c}")) for c in ("B", "M", "N", "K"))
    seconds = _positive(r["Latency"], "column Latency") * 1e-3
    if op == "attention":
        kernel = KernelSpec(OpFamily.ATTENTION, dims, Dtype(dtype), "attention")
        label = f"fa2 fwd d{dims[3]} s{dims[1]} bh{dims[0]}"
    else:
        kernel = KernelSpec(OpFamily.BMM, dims, Dtype(dtype))
        b, m, k, n = dims
        label = f"gemm {m}x{n}x{k}" if b == 1 else f"bmm {b}x{m}x{n}x{k}"
    return Case(gpu_id, (kernel,), kernel.flops() / seconds / 1e12, label, source)


def collected_cases(paths: Sequence[Path]) -> list[Case]:
    """Tensor-core GEMM and flash-attention cases of `tilesim kernels collect` CSVs (the
    project's own measurements); a `TensorCoreError` naming the file, row and fix for a file
    that cannot be read or a row that cannot be used."""
    cases: list[Case] = []
    for path in paths:
        try:
            with path.open(newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise TensorCoreError(
                f"cannot read {path} ({e}); give a CSV that `tilesim kernels collect` wrote"
            ) from None
        for i, r in enumerate(rows, start=2):  # line 1 is the header
            try:
                case = _collected_case(r, str(path))
            except (KeyError, TypeError, ValueError) as e:
                why = f"lacks column {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
                raise TensorCoreError(
                    f"{path}: line {i}: {why}; give a CSV that `tilesim kernels collect` "
                    "wrote on a GPU"
                ) from None
            if case is not None:
                cases.append(case)
        if not any(c.source == str(path) for c in cases):  # it was silently left out
            raise TensorCoreError(
                f"{path}: no tensor-core GEMM (bmm in bf16, fp16, fp8 or tf32) or "
                "flash-attention-2 forward row; give a CSV that `tilesim kernels collect` wrote "
                "on a GPU with such rows"
            )
    return cases


def predicted_tflops(cases: list[Case], params: TCParams) -> F64:
    """Achieved TFLOP/s the model predicts for each case."""
    model = TensorCoreModel(params)
    out = np.empty(len(cases), dtype=np.float64)
    for gpu_id in sorted({c.gpu_id for c in cases}):
        idx = [i for i, c in enumerate(cases) if c.gpu_id == gpu_id]
        kernels = [k for i in idx for k in cases[i].kernels]
        seconds = iter(model.predict_s(kernels, load_gpu(gpu_id)))
        for i in idx:
            total_s = sum(next(seconds) for _ in cases[i].kernels)
            out[i] = cases[i].flops / total_s / 1e12
    return out


def _log_loss(cases: list[Case]) -> Callable[[TCParams], float]:
    measured = np.array([c.measured_tflops for c in cases])
    return lambda p: float(np.mean(np.log(predicted_tflops(cases, p) / measured) ** 2))


def _fit(
    loss: Callable[[TCParams], float], params: TCParams, bounds: dict[str, tuple[float, float]]
) -> TCParams:
    """Coordinate descent on shrinking grids (8 rounds, 21 points a parameter)."""
    for rnd in range(8):
        for name, (lo, hi) in bounds.items():
            half = (hi - lo) / 2.0 ** (rnd + 1)
            cur = float(getattr(params, name))
            grid = np.unique(np.clip(np.linspace(cur - half, cur + half, 21), lo, hi))
            changes: list[dict[str, Any]] = [{name: float(v)} for v in grid]
            trials = [replace(params, **c) for c in changes]
            params = trials[int(np.argmin([loss(t) for t in trials]))]
    return params


def calibrate(
    data_dir: Path = DEFAULT_DATA_DIR,
    *,
    holdout: str | None = None,
    out: Path | None = None,
    measured: Sequence[Path] = (),
) -> TCParams:
    """Fit the constants on every non-H100 GPU of microbenchmarks.json and of the collected
    ``measured`` CSVs but ``holdout``; every case weighs the same. The user's CSVs are read
    first, so their mistakes are named even without the shared data."""
    collected = collected_cases(measured)
    cases, hbm = benchmark_cases(data_dir)
    cases += collected
    gpus_measured = sorted({c.gpu_id for c in cases})
    if holdout is not None and holdout not in gpus_measured:
        raise TensorCoreError(
            f"holdout {holdout!r}: no measurements of it; hold out one of "
            f"{', '.join(gpus_measured)}, or 'none'"
        )
    used = [c for c in cases if c.gpu_id != holdout]
    if not used:
        raise TensorCoreError(f"holdout {holdout!r} leaves nothing to calibrate on; use 'none'")
    gpus = sorted({c.gpu_id for c in used})
    params = TCParams(
        hbm_efficiency=float(np.mean([hbm[g] for g in gpus if g in hbm] or [0.85])),
        calibrated_on=",".join(gpus),
    )
    gemm = [c for c in used if c.family is not OpFamily.ATTENTION]
    params = _fit(_log_loss(gemm), params, FITTED)
    attn = [c for c in used if c.family is OpFamily.ATTENTION]
    if attn:
        params = _fit(_log_loss(attn), params, FA_FITTED)
    if out is not None:
        note = "Written by forecast.tc_calibrate.calibrate from microbenchmarks.json"
        if measured:
            note += " and " + ", ".join(p.name for p in measured)
        held = f"held out: {holdout}" if holdout else "nothing held out"
        save_params(params, out, f"{note}\nCalibrated on: {params.calibrated_on}; {held}; no H100.")
    return params


def validation_rows(
    params: TCParams, data_dir: Path = DEFAULT_DATA_DIR, measured: Sequence[Path] = ()
) -> list[dict[str, object]]:
    """Every case with measured and predicted TFLOP/s, error, and whether it was calibrated on."""
    cases, _ = benchmark_cases(data_dir)
    cases += collected_cases(measured)
    pred = predicted_tflops(cases, params)
    used = set(params.calibrated_on.split(","))
    return [
        {
            "gpu": c.gpu_id,
            "case": c.label,
            "dtype": c.kernels[0].dtype.value,
            "source": c.source,
            "split": "calibration" if c.gpu_id in used else "holdout",
            "measured_tflops": c.measured_tflops,
            "predicted_tflops": round(float(p), 1),
            "error_pct": round(float(p / c.measured_tflops - 1.0) * 100.0, 1),
        }
        for c, p in zip(cases, pred, strict=True)
    ]
