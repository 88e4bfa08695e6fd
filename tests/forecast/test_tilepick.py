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


def _three_shapes() -> TileTable:
    dims = np.log2(np.array([SMALL, LARGE, (1, 4096, 1024, 4096)], dtype=np.float32))
    choice = np.array([[64, 64, 1], [128, 128, 1], [256, 128, 2]], dtype=np.int64)
    return TileTable("src", 8.0, 10, dims, choice)


def test_candidates_are_the_nearest_shapes_choices_nearest_first(tiny_gpu: GPUSpec) -> None:
    picker = TilePicker({"bmm": [_three_shapes()]})
    between = np.array([(1, 1500, 1024, 1500)], dtype=np.int64)  # nearer LARGE than SMALL
    got, counts = picker.candidates("bmm", tiny_gpu, between, 2)
    assert got.shape == (1, 2, 3) and counts.tolist() == [[True, True]]
    assert got[0].tolist() == [[128, 128, 1], [64, 64, 1]]
    assert (picker.pick("bmm", tiny_gpu, between) == got[:, 0]).all()


def test_only_shapes_within_one_doubling_of_the_nearest_count(tiny_gpu: GPUSpec) -> None:
    # log2 distances: LARGE 0.64, SMALL 0.78 (counts), the 4096 shape 2.05, 1.41 past LARGE
    picker = TilePicker({"bmm": [_three_shapes()]})
    near = np.array([(1, 1500, 1024, 1500)], dtype=np.int64)
    _, counts = picker.candidates("bmm", tiny_gpu, near, 3)
    assert counts.tolist() == [[True, True, False]]
    _, counts = picker.candidates("bmm", tiny_gpu, near, 3, within=3.0)
    assert counts.tolist() == [[True, True, True]]


def test_a_measured_shape_counts_its_own_choice_alone(tiny_gpu: GPUSpec) -> None:
    picker = TilePicker({"bmm": [_three_shapes()]})
    got, counts = picker.candidates("bmm", tiny_gpu, np.array([LARGE], dtype=np.int64), 3, 10.0)
    assert got[0, 0].tolist() == [128, 128, 1] and counts.tolist() == [[True, False, False]]


def test_slots_past_a_small_table_do_not_count(tiny_gpu: GPUSpec) -> None:
    picker = TilePicker({"bmm": [_three_shapes()]})
    far = np.array([(1, 8192, 1024, 8192)], np.int64)
    got, counts = picker.candidates("bmm", tiny_gpu, far, 5, within=10.0)
    assert got[0, :, 0].tolist() == [256, 128, 64, 256, 256]
    assert counts.tolist() == [[True, True, True, False, False]]


def test_no_table_gives_the_default_tile_counted_once(tiny_gpu: GPUSpec) -> None:
    got, counts = TilePicker({}).candidates("bmm", tiny_gpu, np.array([SMALL], np.int64), 4)
    assert got.shape == (1, 4, 3) and (got == (128, 128, 1)).all()
    assert counts.tolist() == [[True, False, False, False]]
