"""Kernel measurements in the NeuSight schema: columns, units, loading and validation.

A measurements table has one row per kernel call. Required columns: ``OPName``,
``Latency`` (milliseconds, as in the NeuSight data), ``Device`` and the shape columns
``B,M,N,K`` (bmm, linear) or ``B,H`` (vector ops). Optional: ``Kernel Name``,
``Grid x/y/z``, ``Block x/y/z`` (launch), ``dtype`` (default fp32).

`load_measurements` returns a `Measurements` frame in SI units (``latency_s``) with the
family/op resolved; rows it cannot use are reported in ``skipped``, never dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecast.kernels import GEMM_FAMILIES, NEUSIGHT_OPS, Dtype, KernelSpec, OpFamily

REQUIRED = ("OPName", "Latency", "Device")
GEMM_DIMS = ("B", "M", "N", "K")
ROW_DIMS = ("B", "H")
LAUNCH = ("Grid x", "Grid y", "Grid z", "Block x", "Block y", "Block z")

_TILE_RE = re.compile(r"(\d+)x(\d+)")
MAX_DIM = 2**31  # a shape column above this is a typo, and would overflow int64 products


class DataError(ValueError):
    """A measurement file that cannot be read; the message names the file and the fix."""


@dataclass
class Skipped:
    """A row that was not scored, and why."""

    row: int
    reason: str


@dataclass
class Measurements:
    """Rows of one or more measurement files, resolved to families (SI units)."""

    frame: pd.DataFrame
    skipped: list[Skipped] = field(default_factory=list)
    # (first global row, file) of each file read, in order: where a global row came from
    files: list[tuple[int, str]] = field(default_factory=list)

    def where(self, row: int) -> tuple[str, int]:
        """The file a global row was read from, and its line there (the header is line 1)."""
        first, path = max((f for f in self.files if f[0] <= row), default=(0, ""))
        return path, row - first + 2

    def skipped_json(self, more: list[Skipped] | None = None) -> list[dict[str, Any]]:
        """Skipped rows as JSON objects: the global row, its file and line, and the reason."""
        out = []
        for s in (*self.skipped, *(more or [])):
            path, line = self.where(s.row)
            out.append({"row": s.row, "file": path, "line": line, "reason": s.reason})
        return out

    def family(self, family: OpFamily) -> pd.DataFrame:
        """Rows of one family."""
        return self.frame[self.frame["family"] == family.value]

    def kernels(self, frame: pd.DataFrame | None = None) -> list[KernelSpec]:
        """KernelSpecs of the rows of ``frame`` (default: all rows)."""
        f = self.frame if frame is None else frame
        return [kernel_of_row(r) for r in f.itertuples(index=False)]


def kernel_of_row(r: object) -> KernelSpec:
    """The KernelSpec of one resolved row (a namedtuple from ``frame.itertuples``)."""
    fam = OpFamily(getattr(r, "family"))  # noqa: B009 (namedtuple field)
    if fam in GEMM_FAMILIES:
        dims: tuple[int, ...] = tuple(int(getattr(r, c)) for c in GEMM_DIMS)
    else:
        dims = (int(getattr(r, "B")), int(getattr(r, "H")))  # noqa: B009
    return KernelSpec(fam, dims, Dtype(getattr(r, "dtype")), getattr(r, "op"))  # noqa: B009


def read_table(path: Path) -> pd.DataFrame:
    """Read one .csv or .csv.gz file; a `DataError` if it cannot be read."""
    if not path.is_file():
        what = (
            "a folder"
            if path.is_dir()
            else "not a regular file (a device, pipe or socket)"
            if path.exists()
            else "no such file"
        )
        raise DataError(f"cannot read {path}: {what} (give a .csv or .csv.gz path)")
    # .gz or plain text only: pandas also guessed .zip/.bz2/.xz/.tar from the name, and a bad
    # .zip was a BadZipFile traceback
    try:
        if path.suffix == ".gz":
            return pd.read_csv(path, low_memory=False, compression="gzip")
        return pd.read_csv(path, low_memory=False, compression=None)
    except (OSError, ValueError, EOFError) as e:  # EOFError: a truncated .gz
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"cannot read {path} as .csv or gzipped .csv.gz: {msg}") from e


def _check_columns(df: pd.DataFrame, path: Path) -> None:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)}; the NeuSight schema needs "
            f"{', '.join(REQUIRED)} and the shape columns B,M,N,K or B,H"
        )


def _resolve(df: pd.DataFrame, offset: int) -> tuple[pd.DataFrame, list[Skipped]]:
    """Map OPName to family/op, check shapes, convert ms -> s; collect the rows it cannot use."""
    out, skipped = _map_ops(df, offset)
    bad, reasons = _invalid_rows(out)
    skipped += [Skipped(int(out["row"].iloc[i]), reasons[i]) for i in np.flatnonzero(bad)]
    out = out[~bad].copy()
    out["latency_s"] = pd.to_numeric(out["Latency"]) * 1e-3
    return out, skipped


def _map_ops(df: pd.DataFrame, offset: int) -> tuple[pd.DataFrame, list[Skipped]]:
    """The rows, numbered from ``offset``, with their family and op (dtype fp32 where the
    file has no dtype column); a row of an unknown OPName is skipped."""
    out = df.copy()
    out["row"] = np.arange(offset, offset + len(df))
    fam_op = out["OPName"].map(lambda n: NEUSIGHT_OPS.get(str(n)))
    skipped = [
        Skipped(int(i), f"unknown op {n!r}; accepted: {', '.join(sorted(NEUSIGHT_OPS))}")
        for i, n in zip(out["row"][fam_op.isna()], out["OPName"][fam_op.isna()], strict=True)
    ]
    out = out[fam_op.notna()].copy()
    fam_op = fam_op[fam_op.notna()]
    out["family"] = [f.value for f, _ in fam_op]
    out["op"] = [o for _, o in fam_op]
    if "dtype" not in out.columns:
        out["dtype"] = Dtype.FP32.value
    return out, skipped


def _invalid_rows(out: pd.DataFrame) -> tuple[npt.NDArray[np.bool_], list[str]]:
    """Which rows cannot be used, and each one's first reason: a shape column of its family
    that is not a positive whole number up to 2^31, an empty Device, an unknown dtype, or a
    Latency that is not a positive number."""
    bad = np.zeros(len(out), dtype=bool)
    reasons: list[str] = [""] * len(out)
    for c, broken in _broken_dims(out):
        _mark(bad, reasons, broken, f"column {c} must be a positive whole number up to 2^31")
    device = out["Device"].astype("string").str.strip().fillna("")
    no_device = "column Device is empty; give the GPU's device name or catalog id"
    _mark(bad, reasons, (device == "").to_numpy(), no_device)
    dtypes = {d.value for d in Dtype}
    broken = ~out["dtype"].astype("string").isin(dtypes).fillna(False).to_numpy(dtype=bool)
    _mark(bad, reasons, broken, f"column dtype must be one of {', '.join(d.value for d in Dtype)}")
    lat = pd.to_numeric(out["Latency"], errors="coerce").to_numpy(dtype=float)
    broken = ~(np.isfinite(lat) & (lat > 0))
    _mark(bad, reasons, broken, "column Latency must be a positive number of milliseconds")
    return bad, reasons


def _broken_dims(out: pd.DataFrame) -> Iterator[tuple[str, npt.NDArray[np.bool_]]]:
    """(shape column, rows of a family needing it whose value is not a positive whole number
    up to `MAX_DIM`), the GEMM families' columns first."""
    is_gemm = out["family"].isin([f.value for f in GEMM_FAMILIES])
    needed = {True: GEMM_DIMS, False: ROW_DIMS}
    for gemm, cols in needed.items():
        sel = (is_gemm == gemm).to_numpy()
        for c in cols:
            if c not in out.columns:
                vals = np.full(len(out), np.nan)
            else:
                vals = pd.to_numeric(out[c], errors="coerce").to_numpy(dtype=float)
            ok = np.isfinite(vals) & (vals > 0) & (vals <= MAX_DIM)
            yield c, sel & ~(ok & (np.floor(vals, where=ok, out=np.zeros_like(vals)) == vals))


def _mark(
    bad: npt.NDArray[np.bool_], reasons: list[str], broken: npt.NDArray[np.bool_], reason: str
) -> None:
    """Flag the ``broken`` rows in ``bad``; ``reason`` is the reason of those not yet flagged."""
    for i in np.flatnonzero(broken & ~bad):
        reasons[i] = reason
    bad |= broken


def load_measurements(paths: list[Path] | list[str]) -> Measurements:
    """Load and concatenate measurement files (any mix of ops and devices)."""
    frames: list[pd.DataFrame] = []
    skipped: list[Skipped] = []
    files: list[tuple[int, str]] = []
    offset = 0
    for p in map(Path, paths):
        df = read_table(p)
        _check_columns(df, p)
        resolved, sk = _resolve(df, offset)
        resolved["source"] = str(p)
        frames.append(resolved)
        skipped += sk
        files.append((offset, str(p)))
        offset += len(df)
    if not frames:
        raise DataError("no measurement files given")
    frame = pd.concat(frames, ignore_index=True)
    for c in (*GEMM_DIMS, "H"):
        if c in frame.columns:
            frame[c] = pd.to_numeric(frame[c], errors="coerce").fillna(1).astype(np.int64)
    return Measurements(frame=frame, skipped=skipped, files=files)


def tile_of_kernel_name(name: str) -> tuple[int, int] | None:
    """(tile_rows, tile_cols) encoded in a GEMM kernel name ("ampere_sgemm_128x64_tn")."""
    m = _TILE_RE.search(name.split("tilesize")[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


# The NeuSight split: kernels of these GPUs train the models; every other GPU is unseen.
TRAIN_DEVICES = (
    "Tesla P4",
    "Tesla P100-PCIE-16GB",
    "Tesla T4",
    "Tesla V100-PCIE-32GB",
    "NVIDIA A100-PCIE-40GB",
)
_ELEMENTWISE_DIRS: tuple[str, ...] = ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu")
_ELEMENTWISE_DIRS += ("relu", "gelu", "tanh")
_FAMILY_FILES: dict[OpFamily, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # family: (training globs, test globs) under kernels/nvidia/
    OpFamily.BMM: (("train_merged/bmm.csv.gz",), ("test/bmm.csv.gz",)),
    OpFamily.LINEAR: (("train_merged/linear.csv.gz",), ("test/linear.csv.gz",)),
    OpFamily.ELEMENTWISE: (
        tuple(f"train/{op}/*.csv.gz" for op in _ELEMENTWISE_DIRS),
        ("test/elem.csv.gz",),
    ),
    OpFamily.SOFTMAX: (("train/softmax/*.csv.gz",), ("test/softmax.csv.gz",)),
    OpFamily.LAYERNORM: (("train/ln/*.csv.gz",), ("test/ln.csv.gz",)),
}


def default_data_dir() -> Path:
    """``shared/data/neusight`` beside the project checkout (CI and developers have it)."""
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "neusight"


def neusight_files(data_dir: Path, family: OpFamily) -> list[Path]:
    """Measurement files of one family (training and test sets) in a NeuSight data folder."""
    root = data_dir / "kernels" / "nvidia"
    if not root.is_dir():
        raise DataError(
            f"{data_dir} has no kernels/nvidia folder; pass --data pointing at the NeuSight "
            "data folder (shared/data/neusight)"
        )
    train, test = _FAMILY_FILES[family]
    return sorted(p for pattern in (*train, *test) for p in root.glob(pattern))


def vendor_files(data_dir: Path, family: OpFamily) -> list[Path]:
    """Measurement files of one family under ``kernels/amd/``: NeuSight's AMD MI100 and MI210
    rows, another vendor's, which no model is ever trained on, so its train/<op>/ files are
    test data as much as its test sets (``train_merged/`` only repeats rows of ``train/``).
    None for a data folder without ``kernels/amd`` (an older copy of the data)."""
    root = data_dir / "kernels" / "amd"
    train, test = _FAMILY_FILES[family]
    patterns = [p for p in (*train, *test) if not p.startswith("train_merged/")]
    return sorted(p for pattern in patterns for p in root.glob(pattern))


def trained_families() -> tuple[OpFamily, ...]:
    """Families that have NeuSight measurements (the memory family is a bandwidth model)."""
    return tuple(_FAMILY_FILES)
