"""Measured nccl-tests all-reduce bus bandwidths, read at run time from the shared hardware data.

Never copied into the project: ``microbenchmarks.json`` holds full curves (8x A100, 8x H200) and
``collectives.md`` section 5.1 a table (adds 8x H100 and 4x GB200). Each curve is tagged with the
server id, GPU count and the algorithm the harness used.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.spec import TopologyError

# gpu id in microbenchmarks.json -> (server id, algorithm the harness used). collectives.md 5.1:
# the Azure harness runs "NCCL AllReduce (NVLS algorithm)" on A100/H100/H200 (A100 has no NVLS:
# NCCL's default choice, auto) and the ring on GB200; microbenchmarks.json's H200 record says
# "NVSwitch (NVLS)". Forcing NVLS matters below ~2 MiB, where NCCL's own tuner takes ring/LL.
_SERVER_OF_GPU = {"a100-sxm4-80gb": ("dgx-a100", "auto"), "h200-sxm-141gb": ("hgx-h200", "nvls")}
# column of the collectives.md 5.1 table -> (server id, GPUs, algorithm the harness used)
_TABLE_COLUMNS = {1: ("dgx-a100", 8, "auto"), 2: ("dgx-h100", 8, "nvls"),
                  3: ("hgx-h200", 8, "nvls"), 4: ("gb200-nvl72", 4, "ring")}  # fmt: skip
_UNITS = {"KB": 2**10, "MB": 2**20, "GB": 2**30}


@dataclass(frozen=True)
class MeasuredCurve:
    """nccl-tests all-reduce busbw points (bytes, bytes/s) for one server and GPU count."""

    server: str
    gpus: int
    algorithm: str
    points: tuple[tuple[float, float], ...]
    source: str


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"cannot read measured data {path}: {e}") from e


_MISSING = object()


def _positive(value: Any, where: str) -> float:
    """A measured number: positive and finite (a zero or NaN busbw is refused, not skipped)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and 0 < value < sys.float_info.max:  # not NaN, inf, 0 or an int beyond a float
        return float(value)
    got = "nothing" if value is _MISSING else json.dumps(value)
    raise TopologyError(f"{where} must be a positive finite number, got {got}")


def _power_of_two(nbytes: float) -> float:
    """The message size nccl-tests ran for a ``bytes_approx``: the nearest power of two.

    The curves double from 1 KiB to 8 GiB (nccl-tests ``-f 2``), so every size is a power of
    two; ``bytes_approx`` reads the published labels, which are those sizes in decimal units
    ("33M", "134M"), as binary ones (33 x 2^20 B, 3% over 2^25; "134M" 4.7% over 2^27). The
    same A100 curve in ``collectives.md`` 5.1 lists those points as 64 KB, 1 MB, 16 MB, 128 MB."""
    return float(2.0 ** round(math.log2(nbytes)))


def _from_microbenchmarks(path: Path) -> list[MeasuredCurve]:
    text = _read(path)
    try:
        records = json.loads(text)
    except ValueError as e:
        raise TopologyError(f"cannot read measured data {path}: {e}") from e
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TopologyError(f"{path}: expected a JSON list of one object per GPU")
    curves = []
    for rec in records:
        gpu, raw = rec.get("gpu"), rec.get("nccl_allreduce_8gpu")
        tagged = _SERVER_OF_GPU.get(gpu) if isinstance(gpu, str) else None
        if tagged is None or raw is None:
            continue
        server, algorithm = tagged
        where = f"{path}: gpu {gpu} nccl_allreduce_8gpu"
        if not isinstance(raw, list) or not raw or not all(isinstance(p, dict) for p in raw):
            raise TopologyError(f"{where}: expected a non-empty list of measured points")
        pts = tuple(
            (
                _power_of_two(
                    _positive(p.get("bytes_approx", _MISSING), f"{where}[{i}] bytes_approx")
                ),
                _positive(p.get("busbw_GBps", _MISSING), f"{where}[{i}] busbw_GBps") * 1e9,
            )
            for i, p in enumerate(raw)
        )
        curves.append(MeasuredCurve(server, 8, algorithm, pts, f"{path.name}: {rec.get('system')}"))
    return curves


def _cell_gbps(cell: str, where: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise TopologyError(f"{where} must be a busbw in GB/s, got {cell!r}") from None
    return _positive(value, where) * 1e9


def _from_collectives_md(path: Path) -> list[MeasuredCurve]:
    rows: dict[int, list[tuple[float, float]]] = {c: [] for c in _TABLE_COLUMNS}
    text = _read(path)
    start = text.find("### 5.1")
    if start < 0:
        raise TopologyError(f"{path}: no section '### 5.1' (the all-reduce busbw table)")
    end = text.find("###", start + 4)
    for line in text[start : end if end >= 0 else len(text)].splitlines():
        m = re.match(r"\|\s*(\d+)\s*(KB|MB|GB)\s*\|(.*)\|\s*$", line)
        if not m:
            if rows[1]:
                break  # the busbw table ended; later tables hold derived times
            continue
        nbytes = float(m.group(1)) * _UNITS[m.group(2)]
        cells = [c.replace("*", "").strip() for c in m.group(3).split("|")]
        where = f"{path} section 5.1, row {m.group(1)} {m.group(2)}"
        if len(cells) < len(_TABLE_COLUMNS):
            raise TopologyError(
                f"{where}: {len(cells)} busbw cells, expected {len(_TABLE_COLUMNS)}"
            )
        for col, (srv, n, _) in _TABLE_COLUMNS.items():
            rows[col].append((nbytes, _cell_gbps(cells[col - 1], f"{where}, {srv} x{n} cell")))
    if not rows[1]:
        raise TopologyError(f"{path}: section 5.1 has no busbw table rows ('| 1 KB | ... |')")
    return [
        MeasuredCurve(srv, n, algo, tuple(rows[col]), f"{path.name} section 5.1")
        for col, (srv, n, algo) in _TABLE_COLUMNS.items()
        if rows[col]
    ]


def load_measured(hardware_dir: Path) -> list[MeasuredCurve]:
    """All measured curves under ``hardware_dir`` (``shared/data/hardware``).

    Full curves from microbenchmarks.json win over the coarser table for the same server.
    """
    bench, table = hardware_dir / "microbenchmarks.json", hardware_dir / "collectives.md"
    if not bench.exists() or not table.exists():
        raise TopologyError(
            f"no measured data under {hardware_dir}: expected microbenchmarks.json and "
            "collectives.md; pass --data <shared>/data/hardware"
        )
    curves = _from_microbenchmarks(bench)
    have = {c.server for c in curves}
    return curves + [c for c in _from_collectives_md(table) if c.server not in have]


@dataclass(frozen=True)
class Comparison:
    """One measured point next to the model's prediction."""

    server: str
    gpus: int
    nbytes: float
    measured_busbw_bytes_per_s: float
    predicted_busbw_bytes_per_s: float
    algorithm: str

    @property
    def error(self) -> float:
        """Relative error of the prediction, (predicted - measured) / measured."""
        return self.predicted_busbw_bytes_per_s / self.measured_busbw_bytes_per_s - 1


def compare(curve: MeasuredCurve) -> list[Comparison]:
    """Predict every point of a measured curve with the model."""
    from topologies.catalog import load_cluster  # local: catalog -> cluster, no cycle at import
    from topologies.collectives import collective_estimate

    cluster = load_cluster(curve.server, gpus=curve.gpus)
    ranks = range(curve.gpus)
    out = []
    for nbytes, busbw in curve.points:
        est = collective_estimate("all-reduce", nbytes, ranks, cluster, algorithm=curve.algorithm)
        predicted = est.busbw_bytes_per_s
        out.append(Comparison(curve.server, curve.gpus, nbytes, busbw, predicted, est.algorithm))
    return out
