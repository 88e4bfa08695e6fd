"""The measurements CSV the collector writes: its columns, one row, and what resuming reads.

Rows carry every column of NeuSight's NVIDIA kernel tables (`forecast.dataset`):
``OPName``, ``B,M,N,K`` or ``B,H``, ``Latency`` (ms), ``Device``, ``Kernel Name``, ``Grid/Block
x,y,z``, ``Blocks/Warps per SM`` of the longest kernel the profiler saw, ``Kernels`` (every
kernel of the call, each after a ``;``) and the software versions, plus ``dtype``. ``gemm``
rows are ``bmm`` rows with ``B = 1`` (``M,N,K`` = rows, reduction, cols); ``attention`` rows
put ``BH, S_q, S_kv, D`` in ``B, M, N, K``; ``adam`` rows are ``B = 1, H = parameters``.
Re-running skips rows already in the file (`resume_keys`; a row torn by a kill is cut
first). Imported by `forecast.profile` and, for the header, by the CLI handler, both lazily;
imports on a CPU-only machine (no torch).
"""

from __future__ import annotations

import csv
from pathlib import Path

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
OP_NAMES = {"gemm": "bmm", "elementwise": "add", "layernorm": "ln"}


def row_key(op: str, dtype: str, dims: tuple[int, ...]) -> tuple[str, ...]:
    """Resume key of a row: OPName, dtype and shape columns."""
    name = OP_NAMES.get(op, op)
    return (name, dtype, *(str(d) for d in dims))


def resume_keys(out: Path) -> set[tuple[str, ...]]:
    """`row_key` of every row already in ``out``, after cutting a torn last row."""
    _drop_torn_row(out)
    return _existing_keys(out)


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


def build_row(
    op: str, dtype: str, dims: tuple[int, ...], latency_s: float, device_name: str
) -> dict[str, object]:
    """A timed row: op name, dtype, shape, device and latency (ms); the other columns empty."""
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    cols = ("B", "M", "N", "K") if len(dims) == 4 else ("B", "H")
    row.update(zip(cols, dims, strict=True))
    row.update(OPName=OP_NAMES.get(op, op), dtype=dtype, Device=device_name)
    row["Latency"] = latency_s * 1e3  # NeuSight schema: milliseconds
    return row


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
