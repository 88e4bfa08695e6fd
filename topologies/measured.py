"""Measured nccl-tests all-reduce bus bandwidths, read at run time from the shared hardware data.

Never copied into the project: ``microbenchmarks.json`` holds full curves (8x A100, 8x H200) and
``collectives.md`` section 5.1 a table (adds 8x H100 and 4x GB200). Each curve is tagged with the
server id, GPU count and the algorithm the harness used.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from topologies.spec import TopologyError

# gpu id in microbenchmarks.json -> server id
_SERVER_OF_GPU = {"a100-sxm4-80gb": "dgx-a100", "h200-sxm-141gb": "hgx-h200"}
# column of the collectives.md 5.1 table -> (server id, GPUs, algorithm the harness used)
_TABLE_COLUMNS = {1: ("dgx-a100", 8, "auto"), 2: ("dgx-h100", 8, "auto"),
                  3: ("hgx-h200", 8, "auto"), 4: ("gb200-nvl72", 4, "ring")}  # fmt: skip
_UNITS = {"KB": 2**10, "MB": 2**20, "GB": 2**30}


@dataclass(frozen=True)
class MeasuredCurve:
    """nccl-tests all-reduce busbw points (bytes, bytes/s) for one server and GPU count."""

    server: str
    gpus: int
    algorithm: str
    points: tuple[tuple[float, float], ...]
    source: str


def _from_microbenchmarks(path: Path) -> list[MeasuredCurve]:
    curves = []
    for rec in json.loads(path.read_text()):
        server = _SERVER_OF_GPU.get(rec.get("gpu", ""))
        if server is None or "nccl_allreduce_8gpu" not in rec:
            continue
        pts = tuple(
            (float(p["bytes_approx"]), float(p["busbw_GBps"]) * 1e9)
            for p in rec["nccl_allreduce_8gpu"]
        )
        curves.append(MeasuredCurve(server, 8, "auto", pts, f"{path.name}: {rec['system']}"))
    return curves


def _from_collectives_md(path: Path) -> list[MeasuredCurve]:
    rows: dict[int, list[tuple[float, float]]] = {c: [] for c in _TABLE_COLUMNS}
    text = path.read_text()
    start = text.find("### 5.1")
    for line in text[start : text.find("###", start + 4)].splitlines():
        m = re.match(r"\|\s*(\d+)\s*(KB|MB|GB)\s*\|(.*)\|\s*$", line)
        if not m:
            if rows[1]:
                break  # the busbw table ended; later tables hold derived times
            continue
        nbytes = float(m.group(1)) * _UNITS[m.group(2)]
        cells = [c.replace("*", "").strip() for c in m.group(3).split("|")]
        for col in _TABLE_COLUMNS:
            rows[col].append((nbytes, float(cells[col - 1]) * 1e9))
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
