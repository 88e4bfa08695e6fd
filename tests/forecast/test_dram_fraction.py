"""The row families' DRAM floor runs at the best fraction of peak a training GPU streams at.

Held out of training, the A100-40GB was forecast to stream element-wise kernels at about its
full DRAM peak (it reaches 0.87); no training GPU reaches more than 0.90 of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from forecast.dataset import Measurements
from forecast.features import feature_names
from forecast.gpus import GPUSpec, load_gpu
from forecast.kernels import KernelSpec, OpFamily
from forecast.mlp import TileEnsemble
from forecast.tile_mlp import TileMLPModel
from forecast.tilepick import TilePicker
from forecast.train import STREAM_BYTES, fit_dram_fraction

V100, T4 = "Tesla V100-PCIE-32GB", "Tesla T4"
ROW_FAMILIES = (OpFamily.ELEMENTWISE, OpFamily.SOFTMAX, OpFamily.LAYERNORM)


def _adds(device: str, rows: int, fractions: list[float]) -> list[dict[str, object]]:
    """Element-wise adds of ``rows`` x 4096 on ``device`` timed at ``fractions`` of its peak."""
    nbytes = KernelSpec(OpFamily.ELEMENTWISE, (rows, 4096), op="add").bytes()
    bw = load_gpu(device).hbm_bw_bytes_per_s
    row = {"Device": device, "family": "elementwise", "op": "add", "dtype": "fp32", "H": 4096}
    return [{**row, "B": rows, "latency_s": nbytes / (f * bw)} for f in fractions]


def _measurements() -> Measurements:
    big = int(STREAM_BYTES // (3 * 4 * 4096)) + 1  # an add of this many rows moves > 256 MB
    rows = (
        _adds(V100, big, [0.8, 0.9, 0.95])
        + _adds(V100, 64, [3.0])  # an L2-sized kernel above peak: not streamed from DRAM
        + _adds(T4, big, [0.7, 0.75, 0.8])
    )
    return Measurements(frame=pd.DataFrame(rows))


def test_fraction_is_the_best_device_median_over_streaming_kernels() -> None:
    meas = _measurements()
    assert fit_dram_fraction(meas, [V100, T4]) == pytest.approx(0.9)
    assert fit_dram_fraction(meas, [T4]) == pytest.approx(0.75)
    assert fit_dram_fraction(meas, ["Tesla P4"]) == 1.0  # no rows: the peak


def _fast_model(fraction: float) -> TileMLPModel:
    """Row-family MLPs that forecast every kernel 20x under its base time."""
    mlps = {}
    for family in ROW_FAMILIES:
        net = TileEnsemble(len(feature_names(family)), members=1)
        with torch.no_grad():
            for p in net.parameters():
                p.zero_()
            net.members[0].net[-1].bias.fill_(float(np.log(0.05)))  # type: ignore[index]
        mlps[family] = net
    return TileMLPModel(mlps=mlps, picker=TilePicker({}), dram_fraction=fraction)


def _big_kernels() -> list[KernelSpec]:
    return [
        KernelSpec(OpFamily.ELEMENTWISE, (65536, 4096), op="add"),
        KernelSpec(OpFamily.SOFTMAX, (65536, 4096)),
        KernelSpec(OpFamily.LAYERNORM, (65536, 4096)),
    ]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_row_kernels_beyond_l2_are_not_faster_than_the_fraction_of_peak(
    tiny_gpu: GPUSpec, fraction: float
) -> None:
    ks = _big_kernels()
    got = _fast_model(fraction).predict_s(ks, tiny_gpu)
    nbytes = np.array([k.bytes() for k in ks])
    want = (nbytes - 2 * tiny_gpu.l2_bytes) / (fraction * tiny_gpu.hbm_bw_bytes_per_s)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_fraction_survives_save_and_load_and_old_weights_stream_at_peak(
    tiny_gpu: GPUSpec, tmp_path: Path
) -> None:
    _fast_model(0.6).save(tmp_path)
    assert TileMLPModel.load(tmp_path).dram_fraction == 0.6
    meta_path = tmp_path / "model.json"
    meta = json.loads(meta_path.read_text())
    del meta["row_dram_fraction"]  # weights trained before the fraction was fitted
    meta_path.write_text(json.dumps(meta))
    assert TileMLPModel.load(tmp_path).dram_fraction == 1.0
