"""Tile and wave math against hand-computed counts."""

from __future__ import annotations

import numpy as np

from forecast.gpus import GPUSpec
from forecast.kernels import OpFamily
from forecast.tiles import gemm_work, row_work


def test_gemm_blocks_waves_and_split_k(tiny_gpu: GPUSpec) -> None:
    dims = np.array([[2, 256, 1024, 384]])  # B, M, N (reduction), K
    choice = np.array([[128, 64, 2]])  # tile cols (over K), tile rows (over M), split-K
    w = gemm_work(tiny_gpu, dims, choice)
    blocks = 2 * (256 / 64) * (384 / 128) * 2
    assert w.blocks[0] == blocks == 48
    assert w.blocks_per_sm[0] == np.ceil(48 / 10)
    assert w.flops_per_block[0] == 2 * 128 * 64 * 512
    assert w.inner_len[0] == 512


def test_gemm_occupancy_limited_by_registers(tiny_gpu: GPUSpec) -> None:
    dims = np.array([[1, 4096, 64, 4096], [1, 4096, 64, 4096]])
    w = gemm_work(tiny_gpu, dims, np.array([[128, 128, 1], [32, 32, 1]]))
    assert w.resident_per_sm[0] == np.floor(256 * 1024 / (6 * 128 * 128)) == 2
    assert w.resident_per_sm[1] > w.resident_per_sm[0]
    assert w.waves[0] == np.ceil(32 * 32 / (10 * 2))


def test_elementwise_blocks_of_512_elements(tiny_gpu: GPUSpec) -> None:
    w = row_work(tiny_gpu, OpFamily.ELEMENTWISE, ["add", "relu"], np.array([[127, 168], [1, 1]]))
    assert list(w.blocks) == [np.ceil(127 * 168 / 512), 1]


def test_softmax_layouts_follow_pytorch(tiny_gpu: GPUSpec) -> None:
    dims = np.array([[92, 148], [708, 45], [9127, 1526], [11146, 2492]])
    w = row_work(tiny_gpu, OpFamily.SOFTMAX, ["softmax"] * 4, dims)
    # launch grids measured on an A100: 23, 89, 9127, 11146 blocks; 128, 128, 256, 512 threads
    assert list(w.blocks) == [23, 89, 9127, 11146]
    assert list(w.threads_per_block) == [128, 128, 256, 512]


def test_layernorm_one_block_per_row(tiny_gpu: GPUSpec) -> None:
    w = row_work(tiny_gpu, OpFamily.LAYERNORM, ["layernorm"], np.array([[600, 1216]]))
    assert w.blocks[0] == 600
    assert w.waves[0] == np.ceil(600 / (10 * 16))
