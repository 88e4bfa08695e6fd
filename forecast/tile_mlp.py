"""TileMLPModel: per-family MLPs over tile/wave features, one batched pass per family.

Weights live in ``forecast/data/weights/``: ``<family>.pt`` (the MLP state dict),
``tiles_<family>.npz`` (the tile choices the picker learned from kernel names) and
``model.json`` (feature lists, training GPUs, data hash, held-out errors, the fitted
efficiency of the memory-bound bandwidth model, and the fraction of DRAM peak at the row
families' floor).
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from forecast.bandwidth import BandwidthModel
from forecast.features import FeatureBatch, feature_names, shape_features
from forecast.files import write_together
from forecast.gpus import GPUSpec
from forecast.kernels import (
    GEMM_FAMILIES,
    Dtype,
    KernelSpec,
    OpFamily,
    batch_bytes,
    indices_by_op,
)
from forecast.mlp import TileEnsemble
from forecast.predict import WEIGHTS_DIR, ModelError
from forecast.tilepick import TilePicker, TileTable

log = logging.getLogger(__name__)


# A GEMM shape outside its source GPU's tile table is priced with the tile of each of the 16
# nearest measured shapes no more than one doubling (log2 distance 1) farther than the nearest,
# and its forecast is their mean: which of those kernels the library's heuristic picks on the
# GPU at hand is not in the data, and one borrowed choice, tuned to the source's SM count, let
# a few more rows switch a forecast between tiles (llama3-8b's FFN down projection on the H100
# SXM: 2.51 ms at 576 rows, 1.60 ms at 592). A shape in the table keeps its own choice; a tiny
# one, far from every measured shape, its nearest (the stream's host floor,
# `forecast.stream`, reads those). `benchmarks/feature_ablation.py --candidates` and
# `benchmarks/rows_monotone.py` measured the choice (README, "Which tile the library picks").
TILE_CANDIDATES = 16
TILE_WITHIN = 1.0


def candidate_mean(
    seconds: npt.NDArray[np.float64], counts: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """Per row of (n, k) ``seconds``, the mean of the entries that count."""
    return np.asarray((seconds * counts).sum(axis=1) / counts.sum(axis=1), np.float64)


@dataclass
class TileMLPModel:
    """The tile-level MLP latency model (NeuSight's method, with the fixes of this project)."""

    mlps: dict[OpFamily, TileEnsemble]
    picker: TilePicker
    memory: BandwidthModel = field(default_factory=BandwidthModel)
    meta: dict[str, Any] = field(default_factory=dict)
    dram_fraction: float = 1.0  # of peak DRAM bandwidth at the row families' floor (`dram_floor_s`)
    tile_candidates: int = TILE_CANDIDATES  # GEMMs: the tiles of up to this many shapes
    name: str = "tile-mlp"
    _warned: set[OpFamily] = field(default_factory=set)

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order; one no-grad forward pass per family and dtype."""
        out = np.empty(len(kernels), dtype=np.float64)
        groups: dict[tuple[OpFamily, Dtype], list[int]] = defaultdict(list)
        for i, k in enumerate(kernels):
            groups[(k.family, k.dtype)].append(i)
        for (family, dtype), idx in groups.items():
            batch = [kernels[i] for i in idx]
            if family is OpFamily.MEMORY:
                out[idx] = self.memory.predict_s(batch, gpu)
                continue
            if dtype is not Dtype.FP32:
                raise ModelError(
                    f"tile-mlp is trained on fp32 kernels only, not {dtype.value}; "
                    "use the auto latency model (tensor-core dtypes) or roofline for other dtypes"
                )
            out[idx] = self._predict_family(family, batch, gpu)
        return out

    def _predict_family(
        self, family: OpFamily, kernels: list[KernelSpec], gpu: GPUSpec
    ) -> npt.NDArray[np.float64]:
        """Seconds of kernels of one family and dtype, in arrays of their dims (no
        `KernelSpec` a floored kernel or a halving)."""
        if family not in self.mlps:
            raise ModelError(f"no weights for family {family.value}; run `tilesim kernels train`")
        dims = np.array([k.dims for k in kernels], dtype=np.int64)
        if family in GEMM_FAMILIES:
            return self.gemm_s(family, kernels[0], dims, gpu)
        return self._rows_s(family, kernels[0], dims, [k.op for k in kernels], gpu)

    def gemm_s(
        self, family: OpFamily, like: KernelSpec, dims: npt.NDArray[np.int64], gpu: GPUSpec
    ) -> npt.NDArray[np.float64]:
        """Seconds of GEMMs of (n, 4) ``dims``: the mean over the tiles of their nearest
        measured shapes (`TILE_CANDIDATES`); each distinct candidate of a kernel goes through
        the MLP once."""
        cand, counts = self.picker.candidates(
            family.value, gpu, dims, self.tile_candidates, TILE_WITHIN
        )
        code = (cand[..., 0] << 40) | (cand[..., 1] << 20) | cand[..., 2]  # sides < 2^20
        code = np.where(counts, code, -1)
        code.sort(axis=1)  # per kernel: slots that do not count (-1) first, then equal codes
        counted = code >= 0
        first = counted.copy()
        first[:, 1:] &= code[:, 1:] != code[:, :-1]
        row, col = np.nonzero(first)  # row-major: each kernel's distinct tiles in order
        c = code[row, col]
        tiles = np.column_stack([c >> 40, (c >> 20) & 0xFFFFF, c & 0xFFFFF])
        each = self._net_s(family, shape_features(gpu, like, dims[row], tiles))
        slot = np.zeros(code.shape, dtype=np.int64)
        slot[row, col] = np.arange(len(row))
        slot = np.maximum.accumulate(slot, axis=1)  # a repeated tile takes its first's forecast
        return candidate_mean(each[slot], counted)

    def _rows_s(
        self,
        family: OpFamily,
        like: KernelSpec,
        dims: npt.NDArray[np.int64],
        ops: list[str],
        gpu: GPUSpec,
    ) -> npt.NDArray[np.float64]:
        """Seconds of row kernels of ``family`` like ``like`` (its dtype) with (n, 2) ``dims``
        and operators ``ops``: the MLP's, at least the DRAM floor and, for a softmax or layer
        norm moving more bytes than the L2 holds, the time an element-wise kernel of the same
        shape takes for the same bytes (`STREAM_FLOORED`)."""
        nbytes = batch_bytes(like, dims, ops)
        floor_s = dram_floor_s(nbytes, gpu, self.dram_fraction)
        floored = family in STREAM_FLOORED and OpFamily.ELEMENTWISE in self.mlps
        streamed = nbytes > gpu.l2_bytes if floored else np.zeros(len(dims), dtype=bool)
        if streamed.any():
            unary = KernelSpec(OpFamily.ELEMENTWISE, (1, 1), like.dtype, STREAM_OP)
            big = dims[streamed]
            stream_s = self._rows_s(OpFamily.ELEMENTWISE, unary, big, [STREAM_OP] * len(big), gpu)
            unary_bytes = batch_bytes(unary, big)
            floor_s[streamed] = np.maximum(
                floor_s[streamed], stream_s * nbytes[streamed] / unary_bytes
            )
        dims = at_least_floor(family, dims)
        if family not in ROWS_MONOTONE:
            fb = shape_features(gpu, like, dims, ops=ops)
            return np.maximum(self._net_s(family, fb), floor_s)
        t = np.empty(len(dims))
        for op, idx in indices_by_op(ops).items():
            halved, starts = row_halvings(dims[idx])
            each = self._net_s(family, shape_features(gpu, replace(like, op=op), halved))
            t[idx] = np.maximum.reduceat(each, starts)
        return np.maximum(t, floor_s)

    def _net_s(self, family: OpFamily, fb: FeatureBatch) -> npt.NDArray[np.float64]:
        """The MLP's own seconds of a feature batch."""
        net = self.mlps[family]
        x = torch.from_numpy(fb.x)
        if family not in self._warned and bool(((x < net.lo) | (x > net.hi)).any()):
            self._warned.add(family)
            log.info("%s: some kernels lie outside the training range; clamped", family.value)
        return np.asarray(fb.base_s * np.exp(net.predict(x).double().numpy()), np.float64)

    def save(self, out_dir: Path) -> None:
        """Write weights, tile tables and model.json to ``out_dir``, all of them or none (an
        interrupt left a mix of old and new weights in the committed folder)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        writes: list[tuple[Path, Callable[[Path], object]]] = []
        for family, net in self.mlps.items():
            state = net.state_dict()
            writes.append((out_dir / f"{family.value}.pt", partial(_save_torch, state)))
        for fam_name, tables in self.picker.tables.items():
            arrays: dict[str, Any] = {}
            for t in tables:
                key = f"{t.gpu_id}|{t.compute_capability}|{t.num_sms}"
                arrays[f"{key}|dims"] = t.log_dims
                arrays[f"{key}|choice"] = t.choice
            writes.append((out_dir / f"tiles_{fam_name}.npz", partial(_save_npz, arrays)))
        meta = {
            **self.meta,
            "families": {f.value: list(feature_names(f)) for f in self.mlps},
            "memory": {"efficiency": self.memory.efficiency, "launch_s": self.memory.launch_s},
            "row_dram_fraction": self.dram_fraction,
        }
        text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
        writes.append((out_dir / "model.json", lambda tmp: tmp.write_text(text)))  # last
        write_together(writes)

    @classmethod
    def load(cls, weights_dir: Path | None = None) -> TileMLPModel:
        """Load a trained model (default: the weights committed with the project)."""
        d = weights_dir or WEIGHTS_DIR
        meta_path = d / "model.json"
        if not meta_path.is_file():
            raise ModelError(f"no trained weights in {d}; run `tilesim kernels train`")
        meta = json.loads(meta_path.read_text())
        mlps: dict[OpFamily, TileEnsemble] = {}
        for fam_name, names in meta["families"].items():
            family = OpFamily(fam_name)
            if list(names) != list(feature_names(family)):
                raise ModelError(
                    f"weights in {d} were trained on other {fam_name} features than this "
                    "version computes; run `tilesim kernels train`"
                )
            net = TileEnsemble(len(names), members=int(meta.get("members", 1)))
            net.load_state_dict(torch.load(d / f"{fam_name}.pt", weights_only=True))
            net.eval()
            mlps[family] = net
        tables: dict[str, list[TileTable]] = {}
        for path in sorted(d.glob("tiles_*.npz")):
            fam_name = path.stem.removeprefix("tiles_")
            with np.load(path) as z:
                keys = sorted({k.rsplit("|", 1)[0] for k in z.files})
                tables[fam_name] = [_table(k, z[f"{k}|dims"], z[f"{k}|choice"]) for k in keys]
        mem = meta.get("memory", {})
        memory = BandwidthModel(
            efficiency=mem.get("efficiency", 0.8), launch_s=mem.get("launch_s", 5e-6)
        )
        fraction = float(meta.get("row_dram_fraction", 1.0))  # weights from before it: peak
        return cls(
            mlps=mlps, picker=TilePicker(tables), memory=memory, meta=meta, dram_fraction=fraction
        )


# Row kernels (element-wise, softmax, layer norm) below this many elements all cost one
# call's launch floor in the measurements (A100-PCIE-40GB: every softmax under 5,000 elements
# 32.7-34.4 us, every add up to 2^20 elements 26-27 us), but the MLP, which saw few such
# shapes (none with one row and a short width), extrapolates wildly there: softmax (1, 1)
# 278 us on the A100 80GB, layer norm (1, 1) under 1 us. Such a kernel is forecast as the
# same width (layer norm: at least the narrowest measured one) grown to this many elements,
# a shape inside the data's floor. A layer norm narrower than any measured is forecast at the
# narrowest measured width whatever its size (one block a row either way): left to the MLP,
# 65,536 rows of one element forecast at 2.6 us on the A100 80GB PCIe, 13x under the 34 us of
# 32,768 rows (a floor-sized kernel).
ROW_FLOOR_ELEMENTS = 2**16
MIN_WIDTH = {OpFamily.LAYERNORM: 256}  # layer norms measured: widths 260-4100


# The floor's bandwidth is the best fraction of its DRAM peak any training GPU streams at
# (`forecast.train.fit_dram_fraction`: 0.896, the V100's), not the peak itself. The MLP reads a
# GPU's efficiency off its power and DRAM-type columns and, between four training GPUs, draws
# a line through them: with the A100-40GB held out it extrapolated the HBM GPUs' trend (P100
# 0.73, V100 0.90 of peak) to about 1.0 of the A100's peak, which streams at 0.87. The
# held-out GPU's element-wise error was almost all such a per-GPU offset (median log ratio
# -14% on the A100-40GB, spread about it 2%). Leave-one-GPU-out (`tilesim kernels validate`;
# before: the floor at peak): element-wise 11.2 -> 9.8% (A100-40GB 13.0 -> 7.0, P100 19.3 ->
# 18.5, the others unchanged), softmax 12.7 -> 12.6% (A100-40GB 13.6 -> 13.1), layer norm
# 11.07 -> 11.05% (A100-40GB 10.5 -> 10.4); `benchmarks/feature_ablation.py --floor` prints
# the same means within 0.1 (single GPUs within 0.2). With seeds 5-9: element-wise 12.0 ->
# 10.5% (A100-40GB 13.8 -> 7.4), softmax 13.6 -> 13.3%, layer norm 11.4 -> 11.4%. Rejected:
# the median over kernels moving over 64 MB (the memory family's efficiency), whose mid-size
# kernels lose bandwidth to launch and tail (element-wise 9.1%, but the V100 11.6 -> 14.7%:
# capped at the T4's 0.78).
# The element-wise row envelope (`ROWS_MONOTONE`) changed no test row's forecast (11.2%).


def dram_floor_s(
    nbytes: npt.NDArray[np.float64], gpu: GPUSpec, fraction: float = 1.0
) -> npt.NDArray[np.float64]:
    """The least time the DRAM allows row kernels of ``nbytes`` minimum bytes: those bytes
    less two L2s (the inputs may sit in L2 at its start, the outputs stay there at its end) at
    ``fraction`` of peak bandwidth. The MLP, unbounded, forecast fp32 layer norms of 1-8 GB at
    up to 1.15x the DRAM peak on Hopper and MI300 (outside its training GPUs' bandwidths); a
    kernel L2 can serve keeps the MLP's forecast (the L4's tables run a 25 MB softmax at 1.9x
    its DRAM peak)."""
    return np.maximum(nbytes - 2.0 * gpu.l2_bytes, 0.0) / (fraction * gpu.hbm_bw_bytes_per_s)


# A softmax or layer norm reads its input and writes its output once, as a unary element-wise
# kernel of its shape does, and does more work per element: one that moves more bytes than the
# L2 holds is forecast at least as long as the element-wise MLP forecasts that kernel (``relu``)
# to take, scaled to its bytes. The DRAM floor above is one fraction of peak for every GPU;
# this one is the GPU's own streaming rate as the element-wise family forecasts it (the L4,
# GDDR6, streams at 0.78 of its peak, element-wise and softmax alike, where the softmax MLP
# forecast 0.90). Leave-one-GPU-out (`tilesim kernels validate`): softmax 12.46 -> 12.31% (T4
# 12.2 -> 11.2, V100 17.4 -> 17.7, the others within 0.05), layer norm 11.06 -> 11.09% (T4
# 5.6 -> 5.8); scored as `benchmarks/feature_ablation.py --floor` does, the floor on every
# kernel, on those over one L2 and on those over two gave the same means. Unseen: L4 softmax
# 22.7 -> 6.7%, layer norm 7.1 -> 7.8%, the A100 80GB unchanged, MI100 softmax 24.2 -> 22.6%;
# the L4's softmax errors are what led to it, so its figures are not blind ones. Applied to every
# kernel, the floor doubled a one-row layer norm's launch-bound forecast (its weights' bytes
# over its row's) and raised the tiny kernels that `forecast.stream` reads as a call's host
# cost, so GPT-2 Large's layer norms in a training step on the A100 80GB fell 12.1 -> 7.8 ms.
STREAM_FLOORED = (OpFamily.SOFTMAX, OpFamily.LAYERNORM)
STREAM_OP = "relu"


def at_least_floor(family: OpFamily, dims: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """(n, 2) row-kernel ``dims`` ``B, H`` at least `MIN_WIDTH` wide, and below
    `ROW_FLOOR_ELEMENTS` the floor-sized kernel of their width."""
    wide = np.maximum(dims[:, 1], MIN_WIDTH.get(family, 1))
    rows_at_floor = np.maximum(dims[:, 0], -(-ROW_FLOOR_ELEMENTS // wide))
    return np.column_stack([rows_at_floor, wide])


# More rows of one width are more of the same blocks, never less time; the MLP's ripple on
# the launch plateau broke that (MI300X layer norm of 256: 4,096 rows forecast 17.5% under
# 2,048). A softmax or layer norm is forecast at least as long as the MLP forecasts each of
# its halvings in rows down to the floor's (`row_halvings`).
ROWS_MONOTONE = (OpFamily.SOFTMAX, OpFamily.LAYERNORM)


def row_halvings(
    dims: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For (n, 2) row-kernel ``dims`` ``B, H``: each kernel's dims and those of its width with
    half, a quarter, ... of its rows while they keep at least the floor's rows
    (`ROW_FLOOR_ELEMENTS` elements), one kernel's after another, and where each kernel's start
    (for ``np.maximum.reduceat``). In arrays: a 100k-kernel call makes ~300k of them."""
    rows, width = dims[:, 0], dims[:, 1]
    floor_rows = -(-ROW_FLOOR_ELEMENTS // width)
    shifts = np.arange(int(rows.max()).bit_length())
    halved = rows[:, None] >> shifts[None, :]
    keep = (halved >= floor_rows[:, None]) | (shifts[None, :] == 0)  # a prefix of each row
    out = np.column_stack([halved[keep], np.broadcast_to(width[:, None], halved.shape)[keep]])
    counts = keep.sum(axis=1)
    return out, np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _table(key: str, dims: npt.NDArray[np.float32], choice: npt.NDArray[np.int64]) -> TileTable:
    gpu_id, cc, sms = key.split("|")
    return TileTable(
        gpu_id=gpu_id, compute_capability=float(cc), num_sms=int(sms), log_dims=dims, choice=choice
    )


def _save_torch(state: dict[str, Any], path: Path) -> None:
    torch.save(state, path)


def _save_npz(arrays: dict[str, Any], path: Path) -> None:
    """``np.savez_compressed``'s layout (``np.load`` reads it), each member dated 1980-01-01:
    savez stamps members with the time of writing, so a retrain of the same tables changed
    the committed bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
