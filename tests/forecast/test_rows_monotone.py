"""Softmax and layer norm: more rows of one width are never forecast faster. The MLP alone
rippled on the launch plateau (MI300X layer norm of 256: 4,096 rows 17.5% under 2,048 rows), so
a kernel is forecast at least as long as each of its halvings in rows (`row_halvings`)."""

from __future__ import annotations

import numpy as np
import pytest

from forecast.gpus import list_gpus, load_gpu
from forecast.kernels import KernelSpec, OpFamily
from forecast.predict import LatencyModel, load_latency_model
from forecast.tile_mlp import ROW_FLOOR_ELEMENTS, row_halvings

WIDTHS = {OpFamily.SOFTMAX: (64, 1024, 4096, 16384), OpFamily.LAYERNORM: (256, 1024, 4096)}


def _tile_mlp() -> LatencyModel:
    try:
        return load_latency_model("tile-mlp")
    except ValueError:
        pytest.skip("no trained weights")


@pytest.mark.parametrize(
    ("dims", "rows"),
    [
        ((1000, 256), [1000, 500]),  # 250 rows of 256 fall under the floor's 2^16 elements
        ((256, 256), [256]),
        ((4096, 1024), [4096, 2048, 1024, 512, 256, 128, 64]),
        ((3, 2**20), [3, 1]),
    ],
)
def test_row_halvings_go_down_to_the_floor_rows(dims: tuple[int, int], rows: list[int]) -> None:
    other = (2048, 512)  # a second kernel: each kernel's chain starts where the last one ended
    got, starts = row_halvings(np.array([dims, other], np.int64))
    assert starts.tolist() == [0, len(rows)]
    assert [tuple(d) for d in got[: len(rows)]] == [(r, dims[1]) for r in rows]
    assert [tuple(d) for d in got[len(rows) :]] == [(r, 512) for r in (2048, 1024, 512, 256, 128)]
    assert all(r * w >= min(ROW_FLOOR_ELEMENTS, dims[0] * dims[1]) for r, w in got[: len(rows)])


@pytest.mark.parametrize("gpu_id", list_gpus())
@pytest.mark.parametrize("family", list(WIDTHS))
def test_doubling_the_rows_is_never_faster(gpu_id: str, family: OpFamily) -> None:
    model, gpu = _tile_mlp(), load_gpu(gpu_id)
    shapes = [(2**i, w) for w in WIDTHS[family] for i in range(0, 22)]
    t = dict(
        zip(shapes, model.predict_s([KernelSpec(family, s) for s in shapes], gpu), strict=True)
    )
    for (rows, width), s in t.items():
        if (2 * rows, width) in t:  # the last bits may differ between batch positions
            assert t[(2 * rows, width)] >= s * (1 - 1e-9), (gpu_id, rows, width)
