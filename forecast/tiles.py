"""Tile and wave math: how a kernel's work is cut into thread blocks and run over the SMs.

All functions are vectorised over ``n`` kernels of one family on one GPU and return a
`Work` of arrays. Conventions (see `forecast.kernels` for shapes):

* GEMM (bmm, linear): output ``(B, M, K)`` cut into tiles of ``tile_rows x tile_cols``,
  the reduction ``N`` split ``split_k`` ways; each tile is one thread block.
* element-wise: PyTorch's vectorised kernel, ``num_threads()`` threads (four warps: 128 on
  NVIDIA, 256 on ROCm, whose warp is 64 lanes) x 4 elements per block.
* softmax: rows of ``H <= 1024`` run several rows per 128-thread block (one warp a row,
  two rows a warp when ``H <= 128``); longer rows run one block a row: 128 to 512 threads
  on NVIDIA, 1024 on AMD (`_softmax_layout`).
* layer norm: one ``num_threads()`` block a row.
* memory: copies cut like element-wise.

The launch rules are those of the PyTorch builds the kernel data were measured with (its
README: NVIDIA on 2.1.0, AMD on 2.4.1 for ROCm), checked against every measured element-wise,
softmax and layer-norm row's grid and block on both (`tests/forecast/test_tiles.py`). A call
PyTorch splits into several launches (a softmax past 2^30 elements, an element-wise operand
past 2^31 bytes) is counted as one launch of all their blocks, not each launch's tail.

Blocks resident per SM (occupancy) come from the thread limit of the SM's architecture
and, for GEMM tiles, the register file (accumulators and operand fragments: about
6 bytes per output element of the tile).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import ELEMENTWISE_OPS, MASK_BYTES, MEMORY_OPS, OpFamily

F64 = npt.NDArray[np.float64]

# Resident threads per SM by compute-capability major.minor (CUDA programming guide).
_MAX_THREADS_PER_SM = {"7.5": 1024, "8.6": 1536, "8.7": 1536, "8.9": 1536, "12.0": 1536}
_DEFAULT_THREADS_PER_SM = 2048
_MAX_BLOCKS_PER_SM = 16
_REG_BYTES_PER_TILE_ELEM = 6.0
_DEFAULT_REG_BYTES_PER_SM = 256 * 1024


@dataclass(frozen=True)
class Work:
    """Per-kernel decomposition into blocks and waves, and per-block work."""

    blocks: F64  # thread blocks launched
    threads_per_block: F64
    resident_per_sm: F64  # blocks an SM can hold at once
    waves: F64  # ceil(blocks / (num_sms * resident_per_sm))
    blocks_per_sm: F64  # ceil(blocks / num_sms): blocks the busiest SM runs
    flops_per_block: F64
    bytes_per_block: F64  # operand traffic of one block (from L2 or DRAM)
    inner_len: F64  # elements one block walks along its reduction/row

    @property
    def in_flight_per_sm(self) -> F64:
        """Blocks an SM runs at once: as many as it holds, or fewer when fewer are its share."""
        return np.minimum(self.resident_per_sm, self.blocks_per_sm)


def max_threads_per_sm(gpu: GPUSpec) -> int:
    """Resident-thread limit of an SM of this GPU."""
    return _MAX_THREADS_PER_SM.get(gpu.compute_capability, _DEFAULT_THREADS_PER_SM)


def _finish(gpu: GPUSpec, blocks: F64, threads: F64, resident: F64) -> tuple[F64, F64, F64]:
    limit = np.floor(max_threads_per_sm(gpu) / threads)
    resident = np.clip(np.minimum(resident, limit), 1, _MAX_BLOCKS_PER_SM)
    waves = np.ceil(blocks / (gpu.num_sms * resident))
    per_sm = np.ceil(blocks / gpu.num_sms)
    return resident, waves, per_sm


def gemm_work(gpu: GPUSpec, dims: npt.NDArray[np.int64], choice: npt.NDArray[np.int64]) -> Work:
    """GEMM decomposition for (n, 4) dims ``B,M,N,K`` and (n, 3) tile cols, rows, split."""
    B, M, N, K = (dims[:, i].astype(np.float64) for i in range(4))
    tc, tr, split = (choice[:, i].astype(np.float64) for i in range(3))
    k_len = np.ceil(N / split)
    blocks = B * np.ceil(M / tr) * np.ceil(K / tc) * split
    threads = np.clip(tc * tr / 64.0, 64, 256)
    regs = gpu.regs_bytes_per_sm or _DEFAULT_REG_BYTES_PER_SM
    resident = np.floor(regs / (_REG_BYTES_PER_TILE_ELEM * tc * tr))
    resident, waves, per_sm = _finish(gpu, blocks, threads, resident)
    return Work(
        blocks=blocks,
        threads_per_block=threads,
        resident_per_sm=resident,
        waves=waves,
        blocks_per_sm=per_sm,
        flops_per_block=2.0 * tc * tr * k_len,
        bytes_per_block=4.0 * (tc + tr) * k_len,
        inner_len=k_len,
    )


_SOFTMAX_ILP = 4  # fp32 elements a thread loads at once (sizeof(float4) / sizeof(float))
_THREAD_WORK = 4  # elements a thread of the vectorised element-wise kernel handles
_ROCM_SMEM_PER_BLOCK_BYTES = 65536  # LDS a workgroup may hold on CDNA 1-3


def _rocm(gpu: GPUSpec) -> bool:
    """Whether the GPU runs PyTorch's ROCm build (2.4.1 in the data), not its CUDA one (2.1.0)."""
    return gpu.vendor == "AMD"


def _warp(gpu: GPUSpec) -> int:
    """C10_WARP_SIZE: a ROCm wavefront is 64 lanes."""
    return 64 if _rocm(gpu) else 32


def _num_threads(gpu: GPUSpec) -> float:
    """PyTorch's ``num_threads()``: the block of its element-wise and layer-norm kernels."""
    return 4.0 * _warp(gpu)


def _softmax_layout(gpu: GPUSpec, H: F64) -> tuple[F64, F64]:
    """(rows per block, threads per block) of PyTorch's softmax kernels.

    Rows of up to 1024 columns run ``softmax_warp_forward``: a warp a row (``min(next_pow2(H),
    C10_WARP_SIZE)`` threads), two rows a warp up to 128 columns, 128-thread blocks. Longer
    rows run one block a row. Torch 2.1's ``SoftMax_getBlockSize(ILP, H)`` takes the power of
    two at or above ``min(H // ILP, 1024) // 2``, at least a warp: 512 threads from
    ``H = 4096`` up (it was ``next_pow2(H / 8)`` up to 1024 here, right only to 4,096 and off
    by one doubling just past 1,024 and 2,048). Torch 2.4's ``SoftMaxForward_getBlockSize(H)``
    takes ``min(H, 1024)`` rounded up to whole warps: 1024 threads for every long row."""
    warp = _warp(gpu)
    p2 = 2.0 ** np.ceil(np.log2(np.maximum(H, 1)))
    warp_size = np.minimum(p2, warp)
    rows_per_warp = np.where(p2 <= 128, 2.0, 1.0)
    rows_short = (128 / warp_size) * rows_per_warp
    if _rocm(gpu):
        long_threads = np.ceil(np.minimum(H, 1024) / warp) * warp
    else:
        most = np.maximum(np.minimum(H // _SOFTMAX_ILP, 1024) // 2, 1)
        long_threads = np.maximum(2.0 ** np.ceil(np.log2(most)), warp)
    short = H <= 1024
    return np.where(short, rows_short, 1.0), np.where(short, 128.0, long_threads)


def softmax_rereads(gpu: GPUSpec, H: F64) -> npt.NDArray[np.bool_]:
    """Whether a softmax kernel reads its row from memory again after the first pass (for
    its sum, then its output). The warp kernel (``H <= 1024``) holds the row in registers.
    Torch 2.4's ``cunn_SoftMaxForwardSmem`` (AMD here) holds it in shared memory when it
    fits and ``H`` is a whole number of ILP vectors (its alignment test; the data's AMD rows
    run it at exactly those widths); torch 2.1 has no such kernel."""
    long = H > 1024
    if not _rocm(gpu):
        return np.asarray(long)
    fits = H * 4.0 + 1024 / _warp(gpu) * 4.0 < _ROCM_SMEM_PER_BLOCK_BYTES
    return np.asarray(long & ~(fits & (H % _SOFTMAX_ILP == 0)))


def row_work(gpu: GPUSpec, family: OpFamily, ops: list[str], dims: npt.NDArray[np.int64]) -> Work:
    """Decomposition of the row families for (n, 2) dims ``B,H``."""
    B, H = dims[:, 0].astype(np.float64), dims[:, 1].astype(np.float64)
    n = B * H
    if family is OpFamily.SOFTMAX:
        rows, threads = _softmax_layout(gpu, H)
        blocks = np.ceil(B / rows)
        elems = rows * H
        inner = H
    elif family is OpFamily.LAYERNORM:
        threads = np.full_like(B, _num_threads(gpu))
        blocks = B.copy()
        elems = H
        inner = H
    else:
        threads = np.full_like(B, _num_threads(gpu))
        per_block = threads * _THREAD_WORK
        blocks = np.ceil(n / per_block)
        elems = np.minimum(n, per_block)
        inner = np.full_like(B, float(_THREAD_WORK))
    passes = _passes(family, ops)
    resident, waves, per_sm = _finish(gpu, blocks, threads, np.full_like(B, _MAX_BLOCKS_PER_SM))
    return Work(
        blocks=blocks,
        threads_per_block=threads,
        resident_per_sm=resident,
        waves=waves,
        blocks_per_sm=per_sm,
        flops_per_block=elems * passes[:, 0],
        bytes_per_block=elems * passes[:, 1] * 4.0,
        inner_len=inner,
    )


def _passes(family: OpFamily, ops: list[str]) -> F64:
    """(n, 2) FLOPs and element transfers per element for the row families: each operator
    priced once, then gathered (a tuple a kernel cost 0.1 s of a 100k-kernel forecast)."""
    distinct = list(dict.fromkeys(ops))
    table = np.array([_op_passes(family, o) for o in distinct], dtype=np.float64).reshape(-1, 2)
    if len(distinct) == 1:  # softmax, layer norm, and every batch of halvings
        return np.repeat(table, len(ops), axis=0)
    index = {o: i for i, o in enumerate(distinct)}
    return table[np.fromiter((index[o] for o in ops), np.int64, len(ops))]


def _op_passes(family: OpFamily, op: str) -> tuple[float, float]:
    """FLOPs and element transfers per element of one row operator."""
    if family is OpFamily.ELEMENTWISE:
        return ELEMENTWISE_OPS[op][1], ELEMENTWISE_OPS[op][0] + 1.0
    if family is OpFamily.MEMORY:
        return 0.0, sum(MEMORY_OPS[op]) + MASK_BYTES.get(op, 0.0) / 4.0
    return {OpFamily.SOFTMAX: (5.0, 2.0), OpFamily.LAYERNORM: (8.0, 2.0)}[family]
