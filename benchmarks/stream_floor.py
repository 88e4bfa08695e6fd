"""Whole-model error when a one-call forecast gives up more of its host floor in a stream.

Run: ``python benchmarks/stream_floor.py [--data DIR]`` (a few minutes on one core).

`forecast.stream` reads a kernel's one-call forecast ``P`` as ``max(F, D)``: the floor ``F``
(the forecast of a trivial kernel) hides the device time ``D`` up to ``1.5 F``, and above that
``P`` is device time as it stands. The A100-40GB's linear table looks additive instead: a
median 55-57 us up to 67 MFLOP, then 79, 106 and 161 us where the FLOPs take about 20, 40 and
77 us at the FP32 peak. So this prints each GPU's mean / max |error| of ``e2e_ms`` against
the NeuSight labels (`tilesim validate e2e`) with the shipped reading and with
``D = min(P, max(R, P - s F))`` for GEMMs or for every family, ``s`` the share of the floor
taken off. The training-GPU mean
(A100-40GB, P100, P4, T4, V100) is what a choice would be made by; the other GPUs test it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from unittest.mock import patch

import numpy as np

import forecast.stream as stream
from forecast.dataset import default_data_dir
from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, OpFamily
from forecast.predict import LatencyModel, LatencyTable, forecast_table, load_latency_model
from forecast.roofline import RooflineModel
from simulator.e2e import FITTED
from simulator.e2e_validate import load_labels, predicted_e2e_ms, prepare

TRAINING_GPUS = ("a100-pcie-40gb", "p100-pcie-16gb", "p4", "t4", "v100-pcie-32gb")
DeviceTable = Callable[[LatencyTable, GPUSpec, LatencyModel], LatencyTable]
SHIPPED: DeviceTable = stream._device_table


def minus_floor(families: frozenset[OpFamily], share: float) -> DeviceTable:
    """The shipped reading, but kernels of ``families`` lose ``share`` of their floor."""

    def device(called: LatencyTable, gpu: GPUSpec, model: LatencyModel) -> LatencyTable:
        out = SHIPPED(called, gpu, model)
        if not called:
            return out
        floors = forecast_table({stream.trivial_kernel(k) for k in called}, gpu, model)
        ks = [k for k in called if k.family in families]
        for k, r in zip(ks, RooflineModel().predict_s(ks, gpu), strict=True):
            p, f = called[k], floors[stream.trivial_kernel(k)]
            out[k] = min(p, max(float(r), p - share * f))
        return out

    return device


def main() -> None:
    """Print one line per reading."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=None, help="NeuSight data folder")
    args = parser.parse_args()
    data = args.data or default_data_dir()
    labels, _ = load_labels(data)
    model = load_latency_model("tile-mlp")
    every = frozenset(OpFamily)
    readings = {
        "shipped": SHIPPED,
        "GEMMs - F": minus_floor(GEMM_FAMILIES, 1.0),
        "GEMMs - F/2": minus_floor(GEMM_FAMILIES, 0.5),
        "all - F": minus_floor(every, 1.0),
        "all - F/2": minus_floor(every, 0.5),
    }
    for name, device in readings.items():
        errors: dict[str, list[float]] = {}
        with patch.object(stream, "_device_table", device):  # stream_table looks it up
            for run in prepare(labels, data, model):
                err = abs(predicted_e2e_ms(run, FITTED) / run.label.e2e_ms - 1.0)
                errors.setdefault(run.label.gpu_id, []).append(err)
        train = np.mean([np.mean(errors[g]) for g in TRAINING_GPUS if g in errors]) * 100
        cells = " ".join(
            f"{g} {np.mean(e) * 100:.1f}/{np.max(e) * 100:.1f}" for g, e in sorted(errors.items())
        )
        print(f"{name:12} training GPUs {train:5.2f}% | {cells}", flush=True)


if __name__ == "__main__":
    main()
