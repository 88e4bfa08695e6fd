"""Tile-level features and the analytic base time that the MLP corrects.

For each kernel: ``base_s = max(compute_s, memory_s)`` where ``compute_s`` is the busiest
SM's blocks times the FLOPs of one block over the SM's peak rate (wave quantisation
included), and ``memory_s`` the kernel's minimum DRAM traffic over peak bandwidth. The
MLP predicts ``log(latency_s / base_s)``; its exponent is the inverse of the achieved
utilisation. Features are dimensionless so that they carry over to GPUs never seen:
work against the GPU's own peaks, blocks against its SMs, footprint against its L2.

Row families (element-wise, softmax, layer norm) also get the GPU's DRAM technology
(HBM or GDDR): it sets the reachable fraction of peak bandwidth.

The FP32 rate of an SM counts only its FP32-dedicated lanes (Ampere GA10x and Ada SMs
share half their FP32 lanes with INT32, which SGEMM inner loops need); tensor-core
dtypes use the catalog's per-dtype peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, Dtype, KernelSpec, OpFamily
from forecast.tiles import Work, gemm_work, row_work

F64 = npt.NDArray[np.float64]

GEMM_FEATURES = (
    "log2_compute_over_memory",
    "log2_blocks_per_sm",
    "tail_fill",
    "log2_resident_blocks",
    "log2_inner_len",
    "log2_tile_area",
    "log2_tile_aspect",
    "log2_split_k",
    "log2_footprint_over_l2",
    "log10_base_us",
    "log2_gpu_watts_per_lane_ghz",
)
# bmm: the power feature per process-node-scaled lane (see `gpu_features`)
BMM_FEATURES = (*GEMM_FEATURES[:-1], "log2_gpu_node_watts_per_lane_ghz")
ROW_FEATURES = (
    "log2_compute_over_memory",
    "log2_blocks_per_sm",
    "tail_fill",
    "log2_resident_blocks",
    "log2_inner_len",
    "log2_rows",
    "log2_threads_per_block",
    "log2_footprint_over_l2",
    "log10_base_us",
    "reads_per_elem",
    "log2_gpu_watts_per_lane_ghz",
    "gpu_is_hbm",
)


def feature_names(family: OpFamily) -> tuple[str, ...]:
    """Names of the feature columns of a family, in order."""
    if family is OpFamily.BMM:
        return BMM_FEATURES
    return GEMM_FEATURES if family in GEMM_FAMILIES else ROW_FEATURES


@dataclass(frozen=True)
class FeatureBatch:
    """Features and base times of n kernels of one family on one GPU."""

    x: npt.NDArray[np.float32]  # (n, d)
    base_s: F64  # (n,)
    compute_s: F64
    memory_s: F64


def sm_rate_flops_per_s(gpu: GPUSpec, dtype: Dtype) -> float:
    """Peak FLOP/s of one SM for a dtype (FP32: dedicated lanes at the boost clock)."""
    if dtype is Dtype.FP32:
        return 2.0 * gpu.fp32_dedicated_lanes_per_sm * gpu.boost_clock_hz
    return gpu.peak_for(dtype) / gpu.num_sms


def gemm_rate_flops_per_s(gpu: GPUSpec, dtype: Dtype) -> float:
    """Peak FLOP/s of one SM for GEMMs: FP32 GEMMs use AMD's matrix cores where they exist."""
    if dtype is Dtype.FP32 and gpu.fp32_matrix_flops_per_s is not None:
        return gpu.fp32_matrix_flops_per_s / gpu.num_sms
    if dtype is Dtype.FP32:
        return 2.0 * gpu.fp32_dedicated_lanes_per_sm * gpu.boost_clock_hz
    return gpu.peak_for(dtype) / gpu.num_sms


# Switching energy per operation shrinks roughly with the process node; bmm's power feature
# counts watts per lane-GHz in 12 nm-equivalents (the training GPUs span 16, 12 and 7 nm).
_REF_NODE_NM = 12.0


def gpu_features(gpu: GPUSpec, family: OpFamily) -> F64:
    """The GPU's own features (same for every kernel on it), last in a family's columns.

    Board power per FP32-lane GHz marks power-limited cards. Row families also get the DRAM
    technology, which sets the reachable fraction of peak bandwidth (HBM ~0.85, GDDR ~0.75 on
    the training GPUs); it was chosen by leave-one-GPU-out (element-wise 16.8 -> 11.4%, layer
    norm 14.4 -> 11.3%) and left out of GEMMs, where it made that error worse (linear 27.0 ->
    65.0%).

    For bmm the watts are scaled by 12 nm / the die's process node (energy per operation
    shrinks with the node, so a 72 W 5 nm L4 is less power-starved than a 70 W 12 nm T4):
    leave-one-GPU-out bmm 24.7 -> 16.9%. The same scaling for linear was rejected (27.0 ->
    31.0%: P4 held out 15 -> 73%), as was using no power feature for the row families.
    """
    lanes_ghz = gpu.num_sms * gpu.fp32_dedicated_lanes_per_sm * gpu.boost_clock_hz / 1e9
    watts = gpu.tdp_w if gpu.tdp_w is not None else 2.5e-2 * lanes_ghz
    if family is OpFamily.BMM and gpu.process_nm is not None:
        watts *= _REF_NODE_NM / gpu.process_nm
    if family in GEMM_FAMILIES:
        return np.array([np.log2(watts / lanes_ghz)])
    hbm = 1.0 if gpu.memory_type.upper().startswith("HBM") else 0.0
    return np.array([np.log2(watts / lanes_ghz), hbm])


def _times(gpu: GPUSpec, kernel: KernelSpec, work: Work, total_bytes: F64) -> tuple[F64, F64]:
    """Compute and memory seconds of a batch of one family and dtype (``kernel`` is one)."""
    if kernel.family in GEMM_FAMILIES:
        rate = gemm_rate_flops_per_s(gpu, kernel.dtype)
    else:
        rate = sm_rate_flops_per_s(gpu, kernel.dtype)
    compute = work.blocks_per_sm * work.flops_per_block / rate
    return compute, total_bytes / gpu.hbm_bw_bytes_per_s


def _common(gpu: GPUSpec, work: Work, compute: F64, memory: F64) -> list[F64]:
    base = np.maximum(compute, memory)
    return [
        np.log2(np.maximum(compute, 1e-12) / memory),
        np.log2(work.blocks_per_sm),
        work.blocks / (gpu.num_sms * work.blocks_per_sm),
        np.log2(np.minimum(work.resident_per_sm, work.blocks_per_sm)),
        np.log2(np.maximum(work.inner_len, 1)),
        np.log10(base * 1e6),
    ]


def build_features(
    gpu: GPUSpec, kernels: list[KernelSpec], choice: npt.NDArray[np.int64] | None = None
) -> FeatureBatch:
    """Features of kernels of one family and dtype on ``gpu``; GEMMs need the tile choice."""
    family = kernels[0].family
    dims = np.array([k.dims for k in kernels], dtype=np.int64)
    total_bytes = np.array([k.bytes() for k in kernels], dtype=np.float64)
    footprint = np.log2(total_bytes / gpu.l2_bytes)
    g = np.tile(gpu_features(gpu, family), (len(kernels), 1))
    if family in GEMM_FAMILIES:
        if choice is None:
            raise ValueError("GEMM features need the tile choice")
        work = gemm_work(gpu, dims, choice)
        compute, memory = _times(gpu, kernels[0], work, total_bytes)
        c = _common(gpu, work, compute, memory)
        tc, tr, split = (choice[:, i].astype(np.float64) for i in range(3))
        cols = [*c[:5], np.log2(tc * tr), np.log2(tc / tr), np.log2(split), footprint, c[5]]
    else:
        ops = [k.op for k in kernels]
        work = row_work(gpu, family, ops, dims)
        compute, memory = _times(gpu, kernels[0], work, total_bytes)
        c = _common(gpu, work, compute, memory)
        reads = total_bytes / (dims[:, 0] * dims[:, 1] * kernels[0].itemsize_bytes)
        cols = [
            *c[:5],
            np.log2(dims[:, 0].astype(np.float64)),
            np.log2(work.threads_per_block),
            footprint,
            c[5],
            reads,
        ]
    x = np.column_stack([*cols, g]).astype(np.float32)
    return FeatureBatch(x=x, base_s=np.maximum(compute, memory), compute_s=compute, memory_s=memory)
