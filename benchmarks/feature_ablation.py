"""Leave-one-GPU-out error of one kernel family with some of its feature columns dropped.

Run: ``python benchmarks/feature_ablation.py linear [--drop COL,COL] [--members 5] [--floor]
[--candidates K]``.
Trains the family's ensemble once per training GPU held out (on the other four, as `tilesim kernels
validate` does) with the named columns of `forecast.features.feature_names` removed, and
prints each held-out GPU's mean absolute percentage error on its NeuSight test rows and their
mean: the number feature choices in `forecast/features.py` were made by. The unseen GPUs
(L4, A100 80GB PCIe) are printed too, with a model trained on all five, but a choice made by
them would be tuned to them. Reads ``../shared/data/neusight`` (or ``--data``); nothing is
written. A GEMM family takes 5-10 minutes on one core with five members. ``--floor``: row
families are scored as `TileMLPModel.predict_s` forecasts them, at least their DRAM floor at the
fold's fraction of peak (`forecast.tile_mlp.dram_floor_s`, `forecast.train.fit_dram_fraction`)
and, for softmax and layer norm moving more bytes than the L2 holds, the fold's element-wise
forecast of a unary kernel of their shape scaled to their bytes
(`forecast.tile_mlp.STREAM_FLOORED`; the element-wise family is trained in each fold too).
The row envelope (`ROWS_MONOTONE`) and the small-kernel floor are not applied.
``--sustain W``: GEMMs with another power cut for the sustained clock of power-capped cards
(`forecast.features.sustained_clock_ratio`; 0 = every card at its boost clock), as the shipped
0.022 was compared with 0.019, 0.025 and none.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from tqdm import tqdm

import forecast.features
from forecast.dataset import (
    GEMM_DIMS,
    TRAIN_DEVICES,
    Measurements,
    default_data_dir,
    trained_families,
)
from forecast.evaluate import neusight_test_rows, unseen_devices
from forecast.features import build_features, feature_names
from forecast.gpus import load_gpu
from forecast.kernels import GEMM_FAMILIES, KernelSpec, OpFamily, batch_bytes
from forecast.mlp import TileEnsemble
from forecast.tile_mlp import (
    STREAM_FLOORED,
    STREAM_OP,
    TILE_CANDIDATES,
    TILE_WITHIN,
    candidate_mean,
    dram_floor_s,
)
from forecast.tilepick import TilePicker
from forecast.train import (
    DEFAULT_EPOCHS,
    EPOCHS,
    MEMBERS,
    SEED,
    TEST_SHARE,
    build_picker,
    device_batches,
    fit_dram_fraction,
    fit_mlp,
    load_family_data,
    row_weights,
)


def held_out_errors(
    family: OpFamily,
    drop: list[str],
    members: int,
    data: Path,
    floor: bool = False,
    candidates: int = TILE_CANDIDATES,
) -> dict[str, float]:
    """Mean APE per held-out GPU (leave-one-GPU-out), then per unseen GPU; ``floor``: row
    families at least their DRAM floor, as `predict_s` forecasts them."""
    names = feature_names(family)
    unknown = [c for c in drop if c not in names]
    if unknown:
        raise SystemExit(f"--drop {','.join(unknown)}: not a {family.value} column; use {names}")
    keep = [i for i, n in enumerate(names) if n not in drop]
    meas = load_family_data(data, [family])
    floor = floor and family not in GEMM_FAMILIES
    elem = load_family_data(data, [OpFamily.ELEMENTWISE])[OpFamily.ELEMENTWISE] if floor else None
    rows = neusight_test_rows(data)
    test = rows.family(family)
    out: dict[str, float] = {}
    folds = [*TRAIN_DEVICES, None]  # None: train on all five, score the unseen GPUs
    for held in tqdm(folds, desc=f"{family.value} folds", unit="fold"):
        devices = [d for d in TRAIN_DEVICES if d != held]
        picker = build_picker(meas, devices)
        ens = _fit(family, meas[family], picker, devices, keep, members)
        stream = None
        if elem is not None and family in STREAM_FLOORED:
            every = list(range(len(feature_names(OpFamily.ELEMENTWISE))))
            stream = _fit(OpFamily.ELEMENTWISE, elem, picker, devices, every, members)
        for device in [held] if held is not None else unseen_devices(rows):
            r = test[test["Device"] == device]
            gpu = load_gpu(device)
            kernels = rows.kernels(r)
            choices: list[npt.NDArray[np.int64] | None] = [None]
            counts = np.ones((len(r), 1), dtype=bool)
            if family in GEMM_FAMILIES:
                dims = r[list(GEMM_DIMS)].to_numpy(np.int64)
                cands, counts = picker.candidates(family.value, gpu, dims, candidates, TILE_WITHIN)
                choices = [cands[:, i] for i in range(candidates)]
            each = []
            for choice in choices:  # `TileMLPModel.gemm_s`: the mean over candidate tiles
                fb = build_features(gpu, kernels, choice)
                with torch.no_grad():
                    out_c = ens(torch.from_numpy(fb.x[:, keep])).double().numpy()
                each.append(fb.base_s * np.exp(out_c))
            pred = candidate_mean(np.column_stack(each), counts)
            if elem is not None:
                fraction = fit_dram_fraction(elem, devices)
                dims = np.array([k.dims for k in kernels], dtype=np.int64)
                nbytes = batch_bytes(kernels[0], dims, [k.op for k in kernels])
                pred = np.maximum(pred, dram_floor_s(nbytes, gpu, fraction))
            if stream is not None:  # `TileMLPModel._rows_s`: a unary element-wise kernel's
                unary = [KernelSpec(OpFamily.ELEMENTWISE, k.dims, op=STREAM_OP) for k in kernels]
                fb_u = build_features(gpu, unary, None)
                with torch.no_grad():
                    out_u = stream(torch.from_numpy(fb_u.x)).double().numpy()
                unary_bytes = batch_bytes(unary[0], dims)
                unary_s = np.maximum(
                    fb_u.base_s * np.exp(out_u), dram_floor_s(unary_bytes, gpu, fraction)
                )
                streamed = nbytes > gpu.l2_bytes  # as `_rows_s`: kernels the L2 holds keep theirs
                pred = np.where(streamed, np.maximum(pred, unary_s * nbytes / unary_bytes), pred)
            out[device] = float(np.abs(pred / r["latency_s"].to_numpy() - 1).mean() * 100)
    return out


def _fit(
    family: OpFamily,
    meas: Measurements,
    picker: TilePicker,
    devices: list[str],
    keep: list[int],
    members: int,
) -> TileEnsemble:
    """A ``members``-MLP ensemble of ``family`` on ``devices``' rows, feature columns ``keep``."""
    xs, ys, ws = [], [], []
    for fb, r in device_batches(meas, family, picker, devices).values():
        xs.append(fb.x[:, keep])
        ys.append(np.log(r["latency_s"].to_numpy() / fb.base_s))
        ws.append(row_weights(r, TEST_SHARE.get(family, 0.5)))
    x, y, w = np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)
    ens = TileEnsemble(x.shape[1], members=members)
    epochs = EPOCHS.get(family, DEFAULT_EPOCHS)
    for i in range(members):
        ens.members[i] = fit_mlp(x, y, w, epochs=epochs, seed=SEED + i)
    ens.eval()
    return ens


def main() -> None:
    """Print the held-out errors of one ablation."""
    parser = argparse.ArgumentParser()
    parser.add_argument("family", choices=[f.value for f in trained_families()])
    parser.add_argument("--drop", default="", help="comma-separated feature columns to remove")
    parser.add_argument("--members", type=int, default=MEMBERS, help="MLPs per ensemble")
    parser.add_argument("--data", type=Path, default=None, help="NeuSight data folder")
    parser.add_argument(
        "--candidates",
        type=int,
        default=TILE_CANDIDATES,
        help="GEMMs: the mean over the tiles of up to this many nearest measured shapes "
        f"(shipped: {TILE_CANDIDATES}; 1: the nearest shape's tile alone)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="row families: with the DRAM floor (softmax, layer norm: and the element-wise one)",
    )
    parser.add_argument(
        "--sustain",
        type=float,
        default=None,
        help="GEMMs: board watts per 12 nm-equivalent FP32 lane-GHz that holds the boost clock "
        "(shipped: 0.022; 0: every card at its boost clock)",
    )
    args = parser.parse_args()
    if args.sustain is not None:  # read by features.sustained_clock_ratio at each call
        # 0: a cut so low that every card's share of its boost clock comes out 1
        forecast.features._SUSTAIN_NODE_W_PER_LANE_GHZ = args.sustain or 1e-300
    torch.set_num_threads(1)
    family = OpFamily(args.family)
    drop = [c for c in args.drop.split(",") if c]
    data = args.data or default_data_dir()
    errors = held_out_errors(family, drop, args.members, data, args.floor, args.candidates)
    for device, err in errors.items():
        split = "leave-one-GPU-out" if device in TRAIN_DEVICES else "unseen"
        print(f"{family.value:11s} {split:17s} {device:26s} {err:5.1f}%")
    logo = [errors[d] for d in TRAIN_DEVICES if d in errors]
    dropped = ", ".join(drop) or "none"
    options = ", with the DRAM floor" if args.floor else ""
    if args.candidates != TILE_CANDIDATES:
        options += f", the mean over {args.candidates} candidate tiles"
    if args.sustain is not None:
        options += f", sustained-clock cut {args.sustain}"
    mean = f"{np.mean(logo):.1f}%"
    print(f"{family.value}: leave-one-GPU-out mean {mean} (dropped: {dropped}{options})")


if __name__ == "__main__":
    main()
