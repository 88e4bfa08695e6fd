"""Tile and wave math against hand-computed counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest

from forecast.dataset import neusight_files, vendor_files
from forecast.gpus import GPUSpec, load_gpu
from forecast.kernels import OpFamily
from forecast.tiles import gemm_work, row_work, softmax_rereads


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


def test_long_softmax_rows_take_pytorchs_block_size(tiny_gpu: GPUSpec) -> None:
    """torch 2.1's ``SoftMax_getBlockSize(ILP=4, H)``: the power of two at or above
    ``min(H // 4, 1024) // 2``, so never above 512, and integer division at the edges (the
    rule was ``next_pow2(H / 8)`` up to 1,024: 1,024 threads from H = 4,097 up, and one
    doubling too many just past 1,024 and 2,048)."""
    widths = [1025, 1031, 1032, 2049, 4096, 4097, 5120, 16384, 50257]
    dims = np.array([[64, h] for h in widths])
    w = row_work(tiny_gpu, OpFamily.SOFTMAX, ["softmax"] * len(widths), dims)
    assert list(w.threads_per_block) == [128, 128, 256, 256, 512, 512, 512, 512, 512]
    assert list(w.blocks) == [64] * len(widths)  # one block a row


def _launches(frame: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(threads a block, blocks a grid) of measured rows."""
    threads = frame["Block x"] * frame["Block y"] * frame["Block z"]
    grid = frame["Grid x"] * frame["Grid y"] * frame["Grid z"]
    return threads.to_numpy(np.int64), grid.to_numpy(np.int64)


@pytest.mark.parametrize(
    ("files", "gpu"), [(neusight_files, "a100-pcie-40gb"), (vendor_files, "mi210")]
)
def test_softmax_launches_match_every_measured_row(
    neusight_dir: Path, files: Callable[[Path, OpFamily], list[Path]], gpu: str
) -> None:
    """Every softmax row of the data, NVIDIA (torch 2.1: training and test sets, rows up to
    16,384 wide) and AMD (torch 2.4.1 for ROCm), launched the grid and block `row_work` gives
    it, and ran the shared-memory kernel exactly where `softmax_rereads` says the row is read
    once (widths over 1024; NVIDIA's build has no such kernel)."""
    frame = pd.concat(pd.read_csv(p) for p in files(neusight_dir, OpFamily.SOFTMAX))
    frame = frame.drop_duplicates(["B", "H", "Block x", "Block y", "Grid x", "Grid y"])
    dims = frame[["B", "H"]].to_numpy(np.int64)
    spec = load_gpu(gpu)
    w = row_work(spec, OpFamily.SOFTMAX, ["softmax"] * len(frame), dims)
    threads, grid = _launches(frame)
    assert frame["H"].max() >= (16384 if spec.vendor == "NVIDIA" else 4000)
    assert (w.threads_per_block == threads).all(), frame[w.threads_per_block != threads]
    # host_softmax launches the warp kernel on chunks of 2^30 elements and the profile shows
    # the first launch's grid; `row_work` counts the blocks of all of them
    one_launch = (frame["B"] * frame["H"] <= 2**30).to_numpy()
    assert (w.blocks == grid)[one_launch].all(), frame[(w.blocks != grid) & one_launch]
    long = frame["H"].to_numpy() > 1024
    smem = frame["Kernel Name"].str.contains("SoftMaxForwardSmem").to_numpy()
    assert smem.any() == (spec.vendor == "AMD")
    rereads = softmax_rereads(spec, frame["H"].to_numpy(np.float64))
    assert (rereads == (long & ~smem)).all()


@pytest.mark.parametrize(
    ("files", "gpu"), [(neusight_files, "a100-pcie-40gb"), (vendor_files, "mi210")]
)
@pytest.mark.parametrize("family", [OpFamily.ELEMENTWISE, OpFamily.LAYERNORM])
def test_row_launches_match_every_measured_row(
    neusight_dir: Path, files: Callable[[Path, OpFamily], list[Path]], gpu: str, family: OpFamily
) -> None:
    """Every element-wise and layer-norm row of the data launched the grid and block
    `row_work` gives it: 128 threads (512 elements a block) on NVIDIA's build, 256 (1,024)
    on ROCm's."""
    frame = pd.concat(pd.read_csv(p) for p in files(neusight_dir, family))
    frame = frame.drop_duplicates(["OPName", "B", "H"])
    # TensorIterator splits a call whose operand passes 2^31 bytes into launches that index
    # in 32 bits, and the profile shows the first one's grid; `row_work` counts all blocks
    one_launch = (frame["B"] * frame["H"] * 4 <= 2**31).to_numpy()
    frame = frame[one_launch | (family is OpFamily.LAYERNORM)]
    ops = list(frame["OPName"]) if family is OpFamily.ELEMENTWISE else ["layernorm"] * len(frame)
    w = row_work(load_gpu(gpu), family, ops, frame[["B", "H"]].to_numpy(np.int64))
    threads, grid = _launches(frame)
    assert len(frame) > 1000
    assert (w.threads_per_block == threads).all(), frame[w.threads_per_block != threads]
    assert (w.blocks == grid).all(), frame[w.blocks != grid]


def test_layernorm_one_block_per_row(tiny_gpu: GPUSpec) -> None:
    w = row_work(tiny_gpu, OpFamily.LAYERNORM, ["layernorm"], np.array([[600, 1216]]))
    assert w.blocks[0] == 600
    assert w.waves[0] == np.ceil(600 / (10 * 16))
