"""Which tile the GEMM library picks on a GPU, learned from measured kernel names.

cuBLAS names its SGEMM kernels after the output tile (``ampere_sgemm_128x64_tn``: 128
output columns by 64 output rows per thread block) and launches split-K as the grid's
``z`` dimension beyond the batch. `TilePicker` keeps, per training GPU and family, the
shapes it saw with the tile and split the library chose. For a GPU it has not seen it
borrows the choices of the training GPU of the closest architecture (compute capability
first, then SM count; the newest table for another vendor's GPU), and looks up the nearest
measured shape in log2 space of ``(B, M, N, K)``, where a step means "twice as large" on
every axis (NeuSight's raw distance sent every lookup to the largest shapes of one GPU).
For linear, a source GPU with more SMs stands in for a larger output: the library sizes
its tiles to fill the SMs, so the lookup scales the output ``M x K`` by the SM ratio
(leave-one-GPU-out linear 27.0 -> 25.3%; for bmm, whose batch fills the SMs, it was worse:
24.7 -> 26.2%). `TilePicker.candidates` returns the choices of the ``k`` nearest shapes, over
which `forecast.tile_mlp.TileMLPModel` averages its forecast.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.spatial import cKDTree

from forecast.dataset import GEMM_DIMS, tile_of_kernel_name
from forecast.gpus import GPUSpec

# Used when no training GPU is known for a family: a large SGEMM tile, no split.
DEFAULT_TILE = (128, 128, 1)


@dataclass(frozen=True)
class TileTable:
    """Shapes one GPU ran, with the library's choice: tile cols, tile rows, split-K."""

    gpu_id: str
    compute_capability: float
    num_sms: int
    log_dims: npt.NDArray[np.float32]  # (n, 4) log2(B, M, N, K)
    choice: npt.NDArray[np.int64]  # (n, 3) tile_cols, tile_rows, split_k

    @functools.cached_property
    def tree(self) -> cKDTree:
        """A k-d tree over the shapes: exact nearest neighbours in float64, O(log n) a query
        (the brute-force distance matrix was 60% of a 100k-kernel forecast)."""
        return cKDTree(self.log_dims.astype(np.float64))


def _cc_number(cc: str) -> float:
    try:
        return float(cc)
    except ValueError:
        return -1.0


def build_tile_table(gpu: GPUSpec, rows: pd.DataFrame) -> TileTable | None:
    """Tile table of one GPU from measured rows with ``Kernel Name`` and ``Grid z``."""
    if "Kernel Name" not in rows.columns or rows.empty:
        return None
    tiles = rows["Kernel Name"].astype(str).map(tile_of_kernel_name)
    ok = tiles.notna().to_numpy()
    if not ok.any():
        return None
    r = rows[ok]
    t = np.array([list(x) for x in tiles[ok]], dtype=np.int64)
    split = np.ones(len(r), dtype=np.int64)
    if "Grid z" in r.columns:
        gz = pd.to_numeric(r["Grid z"], errors="coerce").fillna(1).to_numpy()
        split = np.maximum(1, np.round(gz / r["B"].to_numpy())).astype(np.int64)
    dims = np.log2(r[list(GEMM_DIMS)].to_numpy(dtype=np.float64)).astype(np.float32)
    return TileTable(
        gpu_id=gpu.id,
        compute_capability=_cc_number(gpu.compute_capability),
        num_sms=gpu.num_sms,
        log_dims=dims,
        choice=np.column_stack([t, split]),
    )


class TilePicker:
    """Nearest-shape lookup of the library's tile choice, per family and source GPU."""

    def __init__(self, tables: dict[str, list[TileTable]]) -> None:
        self.tables = tables  # family -> tables of the training GPUs

    def source_for(self, family: str, gpu: GPUSpec) -> TileTable | None:
        """The training GPU whose choices stand in for ``gpu``: same id, else closest arch."""
        cands = self.tables.get(family, [])
        if not cands:
            return None
        cc = _cc_number(gpu.compute_capability)

        def distance(t: TileTable) -> tuple[bool, float, float]:
            # another vendor's ISA ("gfx90a") has no NVIDIA neighbour: take the newest table
            arch = abs(t.compute_capability - cc) if cc >= 0 else -t.compute_capability
            return (t.gpu_id != gpu.id, arch, abs(np.log2(t.num_sms / gpu.num_sms)))

        return min(cands, key=distance)

    def pick(self, family: str, gpu: GPUSpec, dims: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """(n, 3) array of tile cols, tile rows and split-K for (n, 4) dims ``B,M,N,K``."""
        return self.candidates(family, gpu, dims, 1)[0][:, 0]

    def candidates(
        self, family: str, gpu: GPUSpec, dims: npt.NDArray[np.int64], k: int, within: float = 1.0
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The choices of the ``k`` nearest measured shapes for (n, 4) dims, nearest first,
        (n, k, 3), and which of them count, (n, k): those no more than ``within`` (log2
        units: one doubling) farther than the nearest. A shape the table holds (distance 0)
        counts its own choice alone; slots past a table of fewer than ``k`` shapes repeat its
        nearest and do not count."""
        table = self.source_for(family, gpu)
        if table is None:
            choice = np.tile(np.array(DEFAULT_TILE, dtype=np.int64), (len(dims), k, 1))
            alone = np.zeros((len(dims), k), dtype=bool)
            alone[:, 0] = True
            return choice, alone
        logd = np.log2(np.maximum(dims, 1)).astype(np.float64)
        if family == "linear":
            half = 0.5 * np.log2(table.num_sms / gpu.num_sms)  # M and K share the SM ratio
            logd[:, 1] += half
            logd[:, 3] += half
        q = logd.astype(np.float32).astype(np.float64)
        held = min(k, len(table.choice))
        dist, idx = table.tree.query(q, k=held)
        idx = np.asarray(idx).reshape(len(q), held)
        dist = np.asarray(dist).reshape(len(q), held)
        counts = (dist <= dist[:, :1] + within) & (dist[:, :1] > 0.0)
        counts[:, 0] = True
        if held < k:
            idx = np.concatenate([idx, np.repeat(idx[:, :1], k - held, axis=1)], axis=1)
            counts = np.concatenate([counts, np.zeros((len(q), k - held), dtype=bool)], axis=1)
        return table.choice[idx], counts
