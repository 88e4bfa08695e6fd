"""Scoring: per-family absolute percentage errors, unseen-GPU and leave-one-GPU-out checks.

`score` is the one function behind `tilesim kernels eval`, the validation report, the
README table and the accuracy tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecast.dataset import TRAIN_DEVICES, Measurements, Skipped, trained_families
from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.kernels import OpFamily
from forecast.predict import LatencyModel
from forecast.roofline import RooflineModel

SCORED_FAMILIES = tuple(f for f in OpFamily if f is not OpFamily.MEMORY)


def ape_stats(pred_s: npt.NDArray[np.float64], true_s: npt.NDArray[np.float64]) -> dict[str, Any]:
    """n, mean, median and 90th percentile of the absolute percentage error."""
    ape = np.abs(pred_s / true_s - 1.0) * 100.0
    if len(ape) == 0:
        return {"n": 0, "mape_pct": None, "median_ape_pct": None, "p90_ape_pct": None}
    return {
        "n": len(ape),
        "mape_pct": round(float(ape.mean()), 2),
        "median_ape_pct": round(float(np.median(ape)), 2),
        "p90_ape_pct": round(float(np.percentile(ape, 90)), 2),
    }


def _gpus(frame: pd.DataFrame) -> tuple[dict[str, GPUSpec], list[Skipped]]:
    gpus: dict[str, GPUSpec] = {}
    skipped: list[Skipped] = []
    for device in frame["Device"].unique():
        try:
            gpus[str(device)] = load_gpu(str(device))
        except GPUError as e:
            rows = frame.loc[frame["Device"] == device, "row"]
            skipped += [Skipped(int(r), str(e).split(";")[0]) for r in rows]
    return gpus, skipped


def predict_rows(model: LatencyModel, meas: Measurements) -> tuple[pd.DataFrame, list[Skipped]]:
    """Rows of ``meas`` with a ``pred_s`` column; rows on unknown GPUs are skipped."""
    frame = meas.frame.copy()
    gpus, skipped = _gpus(frame)
    frame = frame[frame["Device"].isin(list(gpus))].copy()
    frame["pred_s"] = np.nan
    for (device, _family), rows in frame.groupby(["Device", "family"], sort=True):
        pred = model.predict_s(meas.kernels(rows), gpus[str(device)])
        frame.loc[rows.index, "pred_s"] = pred
    return frame, skipped


def score(model: LatencyModel, meas: Measurements) -> dict[str, Any]:
    """Per-family error statistics of ``model`` on every scorable row, and the skipped rows."""
    frame, skipped = predict_rows(model, meas)
    out: dict[str, Any] = {}
    for family in SCORED_FAMILIES:
        rows = frame[frame["family"] == family.value]
        if len(rows):
            out[family.value] = ape_stats(rows["pred_s"].to_numpy(), rows["latency_s"].to_numpy())
    out["skipped"] = [{"row": s.row, "reason": s.reason} for s in (*meas.skipped, *skipped)]
    return out


def _test_rows(meas: Measurements, devices: Sequence[str]) -> Measurements:
    f = meas.frame
    sel = f["Device"].isin(list(devices)) & f["source"].str.contains("/test/")
    return Measurements(frame=f[sel].copy())


def unseen_errors(model: LatencyModel, data_dir: Path) -> dict[str, dict[str, Any]]:
    """Per-family error of ``model`` on the test rows of every GPU outside the training set."""
    from forecast.train import load_family_data

    meas = load_family_data(data_dir, trained_families())
    rows = Measurements(frame=pd.concat([m.frame for m in meas.values()], ignore_index=True))
    devices = sorted(d for d in set(rows.frame["Device"]) if d not in TRAIN_DEVICES)
    return {d: _strip(score(model, _test_rows(rows, [d]))) for d in devices}


def validate(data_dir: Path, *, logo: bool = True, progress: bool = True) -> dict[str, Any]:
    """Unseen-GPU and leave-one-GPU-out errors of tile-mlp against roofline.

    Unseen: train on the five training GPUs, score the test rows of every other GPU.
    Leave-one-GPU-out: for each training GPU, train on the other four, score its test rows.
    """
    from forecast.train import load_family_data, train_model

    fams = trained_families()
    meas = load_family_data(data_dir, fams)
    all_rows = Measurements(frame=pd.concat([m.frame for m in meas.values()], ignore_index=True))
    devices = sorted(set(all_rows.frame["Device"]))
    unseen = [d for d in devices if d not in TRAIN_DEVICES]
    report: dict[str, Any] = {"unseen": {}, "logo": {}}
    model = train_model(data_dir, progress=progress)
    for d in unseen:
        rows = _test_rows(all_rows, [d])
        report["unseen"][d] = {
            "tile-mlp": _strip(score(model, rows)),
            "roofline": _strip(score(RooflineModel(), rows)),
        }
    for d in TRAIN_DEVICES if logo else ():
        held = train_model(data_dir, devices=[x for x in TRAIN_DEVICES if x != d], progress=False)
        rows = _test_rows(all_rows, [d])
        report["logo"][d] = {
            "tile-mlp": _strip(score(held, rows)),
            "roofline": _strip(score(RooflineModel(), rows)),
        }
    return report


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "skipped"}
