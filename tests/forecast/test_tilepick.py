"""The tile picker: nearest measured shape of the closest training GPU, SM-scaled for linear."""

from __future__ import annotations

import numpy as np

from forecast.gpus import GPUSpec
from forecast.tilepick import TilePicker, TileTable

SMALL, LARGE = (1, 1024, 1024, 1024), (1, 2048, 1024, 2048)


def _source(num_sms: int) -> TileTable:
    """A training GPU that ran a small output with 64x64 tiles and a 4x larger one with 128x128."""
    dims = np.log2(np.array([SMALL, LARGE], dtype=np.float32))
    choice = np.array([[64, 64, 1], [128, 128, 1]], dtype=np.int64)
    return TileTable("src", 8.0, num_sms, dims, choice)


def test_same_sm_count_takes_the_nearest_shape(tiny_gpu: GPUSpec) -> None:
    picker = TilePicker({"linear": [_source(tiny_gpu.num_sms)]})
    got = picker.pick("linear", tiny_gpu, np.array([SMALL, LARGE], dtype=np.int64))
    assert got[:, 0].tolist() == [64, 128]


def test_linear_on_fewer_sms_takes_the_tile_of_a_proportionally_larger_output(
    tiny_gpu: GPUSpec,
) -> None:
    # the source has 4x the SMs: it fills them with the small output the way the tiny GPU
    # fills its own with a 4x smaller one, so the tiny GPU's small shape reads as the large
    picker = TilePicker({"linear": [_source(4 * tiny_gpu.num_sms)], "bmm": [_source(40)]})
    small = np.array([SMALL], dtype=np.int64)
    assert picker.pick("linear", tiny_gpu, small)[0, 0] == 128
    assert picker.pick("bmm", tiny_gpu, small)[0, 0] == 64  # bmm: its batch fills the SMs
