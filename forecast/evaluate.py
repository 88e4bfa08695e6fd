"""Scoring: per-family absolute percentage errors; unseen-GPU, unseen-vendor and
leave-one-GPU-out checks.

`score` is the one function behind `tilesim kernels eval`, the validation report, the
README table and the accuracy tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecast.dataset import (
    TRAIN_DEVICES,
    Measurements,
    Skipped,
    load_measurements,
    neusight_files,
    trained_families,
    vendor_files,
)
from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.kernels import OpFamily
from forecast.predict import LatencyModel
from forecast.roofline import RooflineModel

SCORED_FAMILIES = tuple(f for f in OpFamily if f is not OpFamily.MEMORY)


NO_ROWS: dict[str, Any] = {"n": 0, "mape_pct": None, "median_ape_pct": None, "p90_ape_pct": None}


def ape_stats(
    pred_s: npt.NDArray[np.float64], true_s: npt.NDArray[np.float64], digits: int | None = 2
) -> dict[str, Any]:
    """n, mean, median and 90th percentile of the absolute percentage error, rounded to
    ``digits`` decimals (None: unrounded, for a report whose table rounds them once)."""
    ape = np.abs(pred_s / true_s - 1.0) * 100.0
    if len(ape) == 0:
        return dict(NO_ROWS)
    stats = (float(ape.mean()), float(np.median(ape)), float(np.percentile(ape, 90)))
    mape, median, p90 = (x if digits is None else round(x, digits) for x in stats)
    return {"n": len(ape), "mape_pct": mape, "median_ape_pct": median, "p90_ape_pct": p90}


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
    for (device, _family, _dtype), rows in frame.groupby(["Device", "family", "dtype"]):
        try:
            pred = model.predict_s(meas.kernels(rows), gpus[str(device)])
        except ValueError as e:  # a dtype this model or GPU does not run (bf16 on a P4)
            skipped += [Skipped(int(r), str(e).splitlines()[0]) for r in rows["row"]]
            continue
        frame.loc[rows.index, "pred_s"] = pred
    return frame[frame["pred_s"].notna()].copy(), skipped


def score(model: LatencyModel, meas: Measurements, digits: int | None = 2) -> dict[str, Any]:
    """Per-family error statistics of ``model`` on every scorable row (`ape_stats`), and the
    skipped rows."""
    frame, skipped = predict_rows(model, meas)
    out: dict[str, Any] = {}
    for family in SCORED_FAMILIES:
        rows = frame[frame["family"] == family.value]
        if len(rows):
            pred, true = rows["pred_s"].to_numpy(), rows["latency_s"].to_numpy()
            out[family.value] = ape_stats(pred, true, digits)
    out["skipped"] = meas.skipped_json(skipped)
    return out


def neusight_test_rows(data_dir: Path) -> Measurements:
    """Rows of the NeuSight test sets (shapes of real transformer layers), every GPU."""
    files = [p for f in trained_families() for p in neusight_files(data_dir, f)]
    return load_measurements([p for p in files if p.parent.name == "test"])


def device_rows(meas: Measurements, device: str) -> Measurements:
    """The rows of one device."""
    return Measurements(frame=meas.frame[meas.frame["Device"] == device].copy(), files=meas.files)


def unseen_devices(meas: Measurements) -> list[str]:
    """Devices of ``meas`` outside the training set, sorted."""
    return sorted(d for d in set(meas.frame["Device"]) if d not in TRAIN_DEVICES)


def unseen_errors(model: LatencyModel, data_dir: Path) -> dict[str, dict[str, Any]]:
    """Per-family error of ``model`` on the test rows of every GPU outside the training set."""
    rows = neusight_test_rows(data_dir)
    return {d: _strip(score(model, device_rows(rows, d))) for d in unseen_devices(rows)}


def unseen_vendor_errors(model: LatencyModel, data_dir: Path) -> dict[str, dict[str, Any]]:
    """tile-mlp against roofline (`_against_roofline`) on every row of another vendor's GPUs
    (`vendor_files`: AMD, train and test sets alike, none ever trained on), per device; empty
    when the data folder has no such rows."""
    files = [p for f in trained_families() for p in vendor_files(data_dir, f)]
    if not files:
        return {}
    rows = load_measurements(files)
    return {d: _against_roofline(model, device_rows(rows, d)) for d in unseen_devices(rows)}


def _against_roofline(model: LatencyModel, rows: Measurements) -> dict[str, Any]:
    # unrounded: the README table rounds once (a MAPE of 21.9548 stored as 21.95 printed 21.9)
    return {
        "tile-mlp": _strip(score(model, rows, digits=None)),
        "roofline": _strip(score(RooflineModel(), rows, digits=None)),
    }


def validate(data_dir: Path, *, logo: bool = True, progress: bool = True) -> dict[str, Any]:
    """Unseen-GPU, unseen-vendor and leave-one-GPU-out errors of tile-mlp against roofline.

    Unseen: the model trained on the five training GPUs (`shipped_or_trained`) scores the test
    rows of every other GPU. Unseen vendor: the same model on every AMD row
    (`unseen_vendor_errors`). Leave-one-GPU-out: for each training GPU, train on the other
    four, score its test rows.
    """
    from forecast.train import load_family_data, train_model

    meas = load_family_data(data_dir, trained_families())  # loaded once for all six fits
    rows = neusight_test_rows(data_dir)
    model, scored = shipped_or_trained(data_dir, meas, progress=progress)
    report: dict[str, Any] = {"unseen": {}, "logo": {}, "unseen_model": scored}
    for d in unseen_devices(rows):
        report["unseen"][d] = _against_roofline(model, device_rows(rows, d))
    report["unseen_vendor"] = unseen_vendor_errors(model, data_dir)
    for d in TRAIN_DEVICES if logo else ():
        devices = [x for x in TRAIN_DEVICES if x != d]
        held = train_model(data_dir, devices=devices, meas=meas, progress=False)
        report["logo"][d] = _against_roofline(held, device_rows(rows, d))
    return report


def shipped_or_trained(
    data_dir: Path, meas: dict[OpFamily, Measurements], *, progress: bool = True
) -> tuple[LatencyModel, str]:
    """The committed weights where they were trained on this data (their ``data_sha256``),
    else a model trained here, and which it is. Training is reproducible within one set of
    library versions only (`forecast.train.trained_with`): a retrain under another pandas
    scored weights other than those that forecast (the L4's element-wise 3.8 -> 4.0%)."""
    from forecast.tile_mlp import TileMLPModel
    from forecast.train import train_model, training_data_hash

    try:
        shipped = TileMLPModel.load()
    except ValueError:  # no committed weights (a ModelError)
        shipped = None
    trained_on = training_data_hash(data_dir, trained_families())
    if shipped is not None and shipped.meta.get("data_sha256") == trained_on:
        return shipped, "the committed weights (trained on this data)"
    return train_model(data_dir, meas=meas, progress=progress), "trained by this run"


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "skipped"}
