"""The tile/wave base time of a kernel and the features with which the MLP corrects it.

For each kernel: ``base_s = max(compute_s, memory_s)`` where ``compute_s`` is the busiest
SM's blocks (tiles) times the FLOPs of one block over the SM's peak rate (wave quantisation
included), and ``memory_s`` the kernel's minimum DRAM traffic over peak bandwidth. The
MLP predicts ``log(latency_s / base_s)``; its exponent is the inverse of the achieved
utilisation. Features are dimensionless so that they carry over to GPUs never seen:
work against the GPU's own peaks, blocks against its SMs, footprint against its L2. Row
families see their block layout; GEMMs see only whole-kernel ratios, their tile entering
through ``base_s`` (see `GEMM_FEATURES`).

Row families (element-wise, softmax, layer norm) also get the GPU's DRAM technology
(HBM or GDDR): it sets the reachable fraction of peak bandwidth. Softmax and layer norm
re-read their rows; ``memory_s`` counts the re-reads L2 cannot hold (`reread_memory_s`), so a
GPU whose L2 holds the rows in flight (the L4's 48 MB) is not charged the training GPUs' DRAM
re-reads.

The FP32 rate of an SM counts only its FP32-dedicated lanes (Ampere GA10x and Ada SMs
share half their FP32 lanes with INT32, which SGEMM inner loops need); tensor-core
dtypes use the catalog's per-dtype peak. A power-capped card (the 70 W T4) cannot hold its
boost clock through an SGEMM: FP32 GEMMs' compute time is taken at the clock its board power
sustains (`sustained_clock_ratio`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, Dtype, KernelSpec, OpFamily, batch_bytes
from forecast.tiles import Work, gemm_work, row_work, softmax_rereads

F64 = npt.NDArray[np.float64]

# GEMMs: no tile columns. The tile a new GPU runs is borrowed from a training GPU, often of
# another generation, and the MLP read its shape, split-K and wave columns (tile area and
# aspect, split, blocks per SM, tail fill, resident blocks, reduction length) as if they were
# the new GPU's own; the borrowed tile still sets the wave-quantised base time the MLP
# corrects. Leave-one-GPU-out (five-seed ensembles) linear 25.6 -> 22.3% (P4 15.4 -> 15.1,
# P100 27.9 -> 32.7, T4 32.0 -> 30.0, V100 23.4 -> 15.8, A100-40GB 29.2 -> 17.7), bmm
# 16.9 -> 15.3% (P4 17.0 -> 13.2, P100 7.4 -> 7.3, T4 30.4 -> 26.9, V100 15.0 -> 13.2,
# A100-40GB 14.6 -> 16.1); keeping the wave columns (24.0%) or the tile-shape columns (24.1%)
# did worse for linear (three-seed ensembles).
GEMM_FEATURES = (
    "log2_compute_over_memory",
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
# Rejected for softmax and layer norm (leave-one-GPU-out, five-member ensembles): the bytes of
# the rows all resident blocks walk at once against L2 (their second and third reads of a row
# hit L2 only while those rows fit): softmax 13.9 -> 13.7%, layer norm 11.3 -> 12.1%. The L4
# runs both at its element-wise share of peak bandwidth (0.78) at every width, where every
# training GPU loses 15-45% against its own element-wise share; its DRAM bytes per SM clock
# (2.5) lie below every training GPU's (4.7-10.2), so a GPU-level column is clamped there.
# That in-flight-over-L2 ratio now sets the DRAM re-reads in the base time instead
# (`reread_memory_s`), where it is a formula, not a clamped column.
# Also rejected for softmax (leave-one-GPU-out, five members, seeds 0-4; 12.7% before, seeds
# 5-9 13.6%): a column for how PyTorch's block softmax walks a row (widths over 1,024 run one
# 16-byte load a thread and, unless the width is a power of two, a scalar tail): the share of
# load slots that carry data 17.4%, the scalar tail's share of the row 14.5%, a power-of-two
# flag 16.6%. At widths 1,280-4,096 every training GPU runs powers of two faster (A100-40GB
# 0.83 of DRAM peak at 2,048 against 0.59-0.66 at 1,600 and 2,560), but by how much varies by
# GPU (none on the P100 and P4), and the columns moved each held-out GPU's offset instead
# (V100 15.1 -> 20.6-25.0%). The slot share for layer norm (128 threads of 4-wide loads):
# 11.1 -> 11.1% (seeds 5-9 11.4 -> 11.4%). Dropping `log2_footprint_over_l2` (the re-reads'
# L2 share is in the base time): softmax 13.8% (seeds 5-9 14.0%), layer norm 11.1 -> 10.6%
# (seeds 5-9 11.4 -> 11.4%).
# Element-wise and layer norm read the busiest SM's threads and the threads it holds at once
# where softmax reads blocks. Every training GPU launches both with 128-thread blocks (512
# elements a block for element-wise), so on NVIDIA the two are the same columns shifted by
# log2(128) (leave-one-GPU-out and unseen GPUs within 0.2 points). ROCm launches 256-thread
# blocks (1,024 elements; `forecast.tiles`), which in blocks read as half the blocks per SM,
# half of them resident: on AMD, element-wise 45.4 / 45.0% (MI100 / MI210) and layer norm
# 50.5 / 47.8% in blocks, 28.2 / 28.2% and 19.3 / 16.6% in threads (28.3 / 28.0% and
# 51.1 / 45.2% with CUDA's 128-thread cut, before the ROCm launch rules). Softmax's training
# launches vary their block (128-512 threads), so there the two are not the same columns: in
# threads its leave-one-GPU-out mean went 12.5 -> 13.1% (P4 5.5 -> 7.4, T4 12.2 -> 13.2),
# within the spread of training seeds but with nothing gained on NVIDIA, so it keeps blocks.
_THREAD_FEATURES = tuple(
    {
        "log2_blocks_per_sm": "log2_threads_per_sm",
        "log2_resident_blocks": "log2_resident_threads",
    }.get(c, c)
    for c in ROW_FEATURES
)
_FAMILY_FEATURES = {
    OpFamily.BMM: BMM_FEATURES,
    OpFamily.LINEAR: GEMM_FEATURES,
    OpFamily.ELEMENTWISE: _THREAD_FEATURES,
    OpFamily.LAYERNORM: _THREAD_FEATURES,
}


def feature_names(family: OpFamily) -> tuple[str, ...]:
    """Names of the feature columns of a family, in order."""
    return _FAMILY_FEATURES.get(family, ROW_FEATURES)


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
    """Peak FLOP/s of one SM for GEMMs: FP32 GEMMs use AMD's matrix cores where they exist,
    and CUDA-core FP32 the clock the board power sustains (`sustained_clock_ratio`)."""
    if dtype is Dtype.FP32 and gpu.fp32_matrix_flops_per_s is not None:
        return gpu.fp32_matrix_flops_per_s / gpu.num_sms
    if dtype is Dtype.FP32:
        return (
            2.0 * gpu.fp32_dedicated_lanes_per_sm * gpu.boost_clock_hz * sustained_clock_ratio(gpu)
        )
    return gpu.peak_for(dtype) / gpu.num_sms


# Switching energy per operation shrinks roughly with the process node; bmm's power feature
# counts watts per lane-GHz in 12 nm-equivalents (the training GPUs span 16, 12 and 7 nm).
# Power of the node ratio, by leave-one-GPU-out (five members): 0.5 15.7%, 0.75 15.3%, 1 15.4%
# (15.3 and 15.3 again with other seeds), 1.5 17.9%. 1 is kept: 0.75 ties it on the training
# GPUs, and TSMC's iso-speed power steps (16 -> 10 -> 7 -> 5 nm: 0.6 x 0.6 x 0.7) put the
# exponent near 1.2, not below 1.
_REF_NODE_NM = 12.0

# FP32 SGEMMs on a power-capped card run below the boost clock: a GPU whose board power per
# FP32 lane-GHz, in 12 nm-equivalents, lies under this holds only that share of its boost
# clock (clock ~ power at a fixed energy per operation), and its GEMMs' compute time, with
# every feature read from it, is taken at that clock. Of the training GPUs it slows the T4
# (0.0172: 0.78 of 1.59 GHz) and the P4 (0.0207: 0.94); the V100, P100 and A100-40GB lie at
# 0.036-0.044. Chosen by leave-one-GPU-out (five-member ensembles, seeds 0-4), with the
# lower clock scaling only the time the MLP multiplies (its features at the boost clock)
# over 0.019 / 0.022 / 0.025: linear 21.3 -> 20.3 / 18.2 / 20.3% (T4 32.0 -> 26.3 / 21.6 /
# 21.3; seeds 5-9 21.6 -> 18.3% at 0.022), bmm 15.3 -> 14.7% at 0.022 (T4 26.9 -> 22.2,
# V100 13.2 -> 16.8). The clock in the features too, as here, ties that (linear 18.4% at
# 0.022) and is one clock for the whole kernel (at 0.030 it scored 25.4%). A card with no
# board power or process node in its sheet keeps its boost clock. `python
# benchmarks/feature_ablation.py linear --sustain 0.025` reruns such a comparison.
_SUSTAIN_NODE_W_PER_LANE_GHZ = 0.022


def _lanes_ghz(gpu: GPUSpec) -> float:
    return gpu.num_sms * gpu.fp32_dedicated_lanes_per_sm * gpu.boost_clock_hz / 1e9


def _node_watts_per_lane_ghz(gpu: GPUSpec, watts: float) -> float:
    """``watts`` per FP32 lane-GHz of ``gpu`` in 12 nm-equivalents (unscaled without a node)."""
    node = _REF_NODE_NM / gpu.process_nm if gpu.process_nm is not None else 1.0
    return watts * node / _lanes_ghz(gpu)


def sustained_clock_ratio(gpu: GPUSpec) -> float:
    """Share of the boost clock ``gpu``'s FP32 SGEMMs sustain under its board power (1 when
    the sheet gives no board power or process node)."""
    if gpu.tdp_w is None or gpu.process_nm is None:
        return 1.0
    return min(1.0, _node_watts_per_lane_ghz(gpu, gpu.tdp_w) / _SUSTAIN_NODE_W_PER_LANE_GHZ)


def gpu_features(gpu: GPUSpec, family: OpFamily) -> dict[str, float]:
    """The GPU's own features (same for every kernel on it), by name.

    Board power per FP32-lane GHz marks power-limited cards. Row families also get the DRAM
    technology, which sets the reachable fraction of peak bandwidth (HBM ~0.85, GDDR ~0.75 on
    the training GPUs); it was chosen by leave-one-GPU-out (element-wise 16.8 -> 11.4%, layer
    norm 14.4 -> 11.3%) and left out of GEMMs, where it made that error worse (linear 27.0 ->
    65.0%).

    For bmm the watts are scaled by 12 nm / the die's process node (energy per operation
    shrinks with the node, so a 72 W 5 nm L4 is less power-starved than a 70 W 12 nm T4):
    leave-one-GPU-out bmm 24.7 -> 16.9%. The same scaling for linear was rejected (27.0 ->
    31.0%: P4 held out 15 -> 73%), as was using no power feature for the row families, and
    the node-scaled watts for the row families (leave-one-GPU-out element-wise 11.4 -> 13.3%,
    softmax 13.9 -> 22.7%, layer norm 11.3 -> 18.9%: V100 and A100-40GB held out lost most;
    `benchmarks/feature_ablation.py` with a five-member ensemble per fold).
    """
    lanes_ghz = _lanes_ghz(gpu)
    watts = gpu.tdp_w if gpu.tdp_w is not None else 2.5e-2 * lanes_ghz
    if family is OpFamily.BMM:
        node_watts = _node_watts_per_lane_ghz(gpu, watts)
        return {"log2_gpu_node_watts_per_lane_ghz": float(np.log2(node_watts))}
    power = {"log2_gpu_watts_per_lane_ghz": float(np.log2(watts / lanes_ghz))}
    if family in GEMM_FAMILIES:
        return power
    return power | {"gpu_is_hbm": 1.0 if gpu.memory_type.upper().startswith("HBM") else 0.0}


def _times(gpu: GPUSpec, kernel: KernelSpec, work: Work, total_bytes: F64) -> tuple[F64, F64]:
    """Compute and memory seconds of a batch of one family and dtype (``kernel`` is one)."""
    if kernel.family in GEMM_FAMILIES:
        rate = gemm_rate_flops_per_s(gpu, kernel.dtype)
    else:
        rate = sm_rate_flops_per_s(gpu, kernel.dtype)
    compute = work.blocks_per_sm * work.flops_per_block / rate
    return compute, total_bytes / gpu.hbm_bw_bytes_per_s


# Softmax (rows over 1,024 wide) and layer norm read each row more than once: softmax three
# times (max, sum, normalise), layer norm twice (moments, normalise); `KernelSpec.bytes` counts
# one read. A re-read comes from L2 while the rows all resident blocks walk at once fit in it,
# else from DRAM: the share that misses rises from 0 at a quarter of the L2 to 1 at the whole
# of it (log-linear). On the training GPUs large-width rows run at 1/2 (softmax) and 2/3
# (layer norm) of the element-wise share of DRAM peak, as two and one extra DRAM reads give;
# narrow rows whose in-flight set fits L2 run at the full share. Chosen by leave-one-GPU-out
# (five-member ensembles): softmax 13.9 -> 12.7%, layer norm 11.3 -> 11.1%. Rejected: every
# re-read from DRAM (softmax 16.1, layer norm 11.4%), the L2 limits at 1/8 and 1/2 (softmax
# 14.2, layer norm 10.0%). No L2 bandwidth limit: the catalog has no measured L2 bandwidth, and
# a fitted 16 B per SM clock (softmax 12.3%) lies far under every GPU's L2 (A100: ~47 B per SM
# clock) and made the fast-DRAM GPUs (A100 80GB, MI300X) slower than their DRAM.
_EXTRA_READS = {OpFamily.SOFTMAX: 2.0, OpFamily.LAYERNORM: 1.0}
_L2_HIT_BELOW, _L2_MISS_ABOVE = 0.25, 1.0  # in-flight rows over L2 bytes


def reread_memory_s(
    gpu: GPUSpec, family: OpFamily, dims: npt.NDArray[np.int64], work: Work, total_bytes: F64
) -> F64:
    """Memory seconds of softmax or layer-norm kernels with their row re-reads: DRAM bytes
    (the minimum plus the re-reads that miss L2) over peak. ``work`` is their `row_work`;
    fp32 rows."""
    rows, width = dims[:, 0].astype(np.float64), dims[:, 1].astype(np.float64)
    extra = np.full_like(width, _EXTRA_READS[family])
    if family is OpFamily.SOFTMAX:
        extra = np.where(softmax_rereads(gpu, width), extra, 0.0)
    reread_bytes = extra * rows * width * 4.0
    in_flight = gpu.num_sms * work.in_flight_per_sm * width * 4.0
    span = np.log2(_L2_MISS_ABOVE / _L2_HIT_BELOW)
    miss = np.clip(np.log2(in_flight / (_L2_HIT_BELOW * gpu.l2_bytes)) / span, 0.0, 1.0)
    return np.asarray((total_bytes + miss * reread_bytes) / gpu.hbm_bw_bytes_per_s, np.float64)


def _common(gpu: GPUSpec, work: Work, compute: F64, memory: F64) -> dict[str, F64]:
    base = np.maximum(compute, memory)
    resident = work.in_flight_per_sm
    return {
        "log2_compute_over_memory": np.log2(np.maximum(compute, 1e-12) / memory),
        "log2_blocks_per_sm": np.log2(work.blocks_per_sm),
        "log2_threads_per_sm": np.log2(work.blocks_per_sm * work.threads_per_block),
        "tail_fill": work.blocks / (gpu.num_sms * work.blocks_per_sm),
        "log2_resident_blocks": np.log2(resident),
        "log2_resident_threads": np.log2(resident * work.threads_per_block),
        "log2_inner_len": np.log2(np.maximum(work.inner_len, 1)),
        "log10_base_us": np.log10(base * 1e6),
    }


def build_features(
    gpu: GPUSpec, kernels: list[KernelSpec], choice: npt.NDArray[np.int64] | None = None
) -> FeatureBatch:
    """Features of kernels of one family and dtype on ``gpu``; GEMMs need the tile choice.
    Columns are those of `feature_names` of the family, in its order."""
    dims = np.array([k.dims for k in kernels], dtype=np.int64)
    return shape_features(gpu, kernels[0], dims, choice, ops=[k.op for k in kernels])


def shape_features(
    gpu: GPUSpec,
    like: KernelSpec,
    dims: npt.NDArray[np.int64],
    choice: npt.NDArray[np.int64] | None = None,
    *,
    ops: list[str] | None = None,
) -> FeatureBatch:
    """`build_features` of kernels of ``like``'s family and dtype with (n, d) ``dims`` and
    operators ``ops`` (default: ``like``'s), without a `KernelSpec` each (`tile_mlp` floors
    row kernels' dims, and prices each softmax's and layer norm's halvings in rows)."""
    total_bytes = batch_bytes(like, dims, ops)
    ops = [like.op] * len(dims) if ops is None else ops
    return _features(gpu, like, ops, dims, total_bytes, choice)


def _features(
    gpu: GPUSpec,
    kernel: KernelSpec,
    ops: list[str],
    dims: npt.NDArray[np.int64],
    total_bytes: F64,
    choice: npt.NDArray[np.int64] | None,
) -> FeatureBatch:
    """`build_features` of kernels like ``kernel`` (its family and dtype) of ``ops``, ``dims``
    and ``total_bytes``."""
    family = kernel.family
    if family in GEMM_FAMILIES:
        if choice is None:
            raise ValueError("GEMM features need the tile choice")
        work = gemm_work(gpu, dims, choice)  # the tile and split-K set the waves of base_s
        compute, memory = _times(gpu, kernel, work, total_bytes)
        own: dict[str, F64] = {}
    else:
        work = row_work(gpu, family, ops, dims)
        compute, memory = _times(gpu, kernel, work, total_bytes)
        if family in _EXTRA_READS:
            memory = reread_memory_s(gpu, family, dims, work, total_bytes)
        own = {
            "log2_rows": np.log2(dims[:, 0].astype(np.float64)),
            "log2_threads_per_block": np.log2(work.threads_per_block),
            # in float: rows x width overflows int64 past 2^63 elements
            "reads_per_elem": total_bytes
            / (dims[:, 0].astype(np.float64) * dims[:, 1] * kernel.itemsize_bytes),
        }
    cols: dict[str, Any] = {
        **_common(gpu, work, compute, memory),
        **own,
        "log2_footprint_over_l2": np.log2(total_bytes / gpu.l2_bytes),
        **gpu_features(gpu, family),  # scalars, broadcast by column_stack below
    }
    n = len(dims)
    x = np.column_stack([np.broadcast_to(cols[c], n) for c in feature_names(family)])
    return FeatureBatch(
        x=x.astype(np.float32),
        base_s=np.maximum(compute, memory),
        compute_s=compute,
        memory_s=memory,
    )
