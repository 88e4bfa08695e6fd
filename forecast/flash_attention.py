"""Flash-attention-2 latency: the sm80 kernels (``mma.sync``, no wgmma/TMA) on any GPU.

The kernels and their tiles are those of Dao-AILab/flash-attention 2.x
(``csrc/flash_attn/src``: ``flash_fwd_launch_template.h``, ``flash_bwd_launch_template.h``,
``kernel_traits.h``, ``flash_bwd_kernel.h``). Per element of ``S = Q K^T`` an SM spends, on
four pipes that run concurrently:

* **tensor**: ``4 D`` FLOPs forward (``Q K^T``, ``P V``), ``10 D`` backward (``S``, ``dP``,
  ``dV``, ``dK``, ``dQ``), at the catalog peak x the GEMM-calibrated ``level``. FA2 issues
  ``mma.sync``, not Hopper's wgmma, and is said to reach well under Hopper's peak with it, but
  the only figure for how far under is an H100 measurement (FlashAttention-3 paper), which
  this project does not use (H100 is its blind held-out GPU); so no Hopper discount is applied
  and the held-out H200 figure shows the cost (+25%, README);
* **shared memory**: 32 banks x 4 bytes = 128 bytes per clock per SM (CUDA programming guide,
  compute capability 5.x and later). Each warp loads (``ldmatrix``) both MMA operands of its
  warp tile: forward, its query rows and all of the K and V tiles; backward, the operands of
  all five matmuls with the backward's smaller warp tiles. Add the ``cp.async`` writes of the
  tiles and, backward, the writes of ``P`` and ``dS``;
* **special functions + FP32**: 16 exp2 per clock per SM (CUDA programming guide, throughput
  table, cc 8.x/9.0) and the FP32 lanes: forward, one exp2, the scale-and-subtract FFMA, row
  max, row sum, half a conversion to 16 bits and the ``O`` rescale (``D / Bc``); backward,
  one exp2 and four FP32 ops (FFMA with the log-sum-exp, ``dS = P (dP - rowsum(dO O))``, two
  half conversions).

The tiles are FA2's for the GPU (`forecast.flash_tiles`): by head dim, by shared memory
per block and by sm86/sm89 where FA2's launchers ask the device.

The pipes combine as a p-norm with the GEMM-calibrated ``overlap_exponent`` and the result is
divided by ``fa_efficiency``, the one attention constant fitted (on A100 measurements). Every
pipe runs at the tensor clock, ``peak / (SMs x MMA FLOPs per clock per SM)`` where that width
is documented (A100 2048, H100/H200 4096, so 1.83 GHz: the FlashAttention-3 paper's "3.9
TFLOPS of special functions" on H100 SXM is 132 x 16 x 1.83 GHz); else the boost clock. A CTA
sweeps all of ``S_kv`` (forward, ``Br`` query rows) or all of ``S_q`` (backward, ``Bc`` key
rows); resident CTAs share their SM, so the busiest SM runs ``ceil(CTAs / SMs)`` tiles. DRAM
time (``KernelSpec.bytes``) overlaps compute like a GEMM's.

Causal (ops ``attention_causal``, ``attention_causal_bwd``): FA2's loops skip the blocks above
the diagonal (mask aligned to the bottom right, `forecast.kernels.causal_pairs`). Forward, the
CTA of query block ``i`` visits key blocks ``0 .. ceil(((i + 1) Br + S_kv - S_q) / Bc) - 1``
(``n_block_max``); backward, the CTA of key block ``j`` visits query blocks from
``floor((j Bc + S_q - S_kv) / Br)`` (``m_block_min``) to the last; for ``S_q = S_kv`` at
``n`` blocks either way, ``n (n + 1) / 2`` of the ``n^2`` block pairs. Each visited pair costs
what a non-causal one does (the diagonal's masking is not charged). The CTAs' sweeps are
unequal and the block scheduler hands the next CTA to the first free SM, so the busiest SM is
taken to run the balanced share, ``ceil(pairs / SMs)``, and at least the longest CTA; with
equal sweeps that is never more than the non-causal ``ceil(CTAs / SMs)`` sweeps.

Split-KV (FA2's ``flash_fwd_splitkv_kernel``, what decoding with a KV cache runs): a forward
of at most 64 query rows (one split-KV query block: decoding, the case FA2 writes it for, "we
don't expect seqlen_q to be larger than 64 for inference"; longer queries keep the calibrated
kernel above) may cut the keys into ``n`` chunks, each a CTA of 64 query rows and ``block_n``
key rows (256 at head dim <= 64, 128 at <= 128, else 64; 4 warps; FA2's ``set_params_splitkv``
in ``csrc/flash_attn/flash_api.cpp``), writing fp32 partial outputs and log-sum-exps that a
second kernel (``flash_fwd_splitkv_combine_kernel``) reads back and reduces. FA2 picks ``n``
by a wave-efficiency rule over ``2 x SMs`` CTA slots (``num_splits_heuristic``); here ``n``
is the count from 1 (the one-pass kernel) to FA2's 128 that this model rates fastest. The
literal rule steps with the SM count, so that a GPU with more SMs and the same everything
else would be forecast slower on some shapes; the best count never is, never is slower than
one pass, and is what the rule aims at (fill the SMs). A causal forward that splits (FA2 turns
a one-row query's causal mask off) is charged every key block, at most ``S_q / S_kv`` of its
pairs too many.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from forecast.flash_tiles import (
    SPLITKV_BLOCK_M,
    PipeCounts,
    SMRates,
    backward_counts,
    forward_counts,
    forward_tile_counts,
    kernel_head_dim,
    splitkv_block_n,
)
from forecast.gpus import GPUSpec
from forecast.kernels import ATTENTION_BACKWARD_OPS, CAUSAL_ATTENTION_OPS, KernelSpec

SMEM_BYTES_PER_CLK_PER_SM = 128.0  # 32 banks x 32 bits per clock (CUDA guide, cc >= 5.x)
MUFU_PER_CLK_PER_SM = 16.0  # exp2 throughput (CUDA guide, arithmetic instructions, cc 8.x, 9.0)


# AMD ISAs with FlashAttention-2 kernels (ROCm's composable-kernel backend: MI200, MI300)
FLASH_ATTENTION_AMD_ISAS = frozenset({"gfx90a", "gfx942", "gfx950"})


def has_flash_attention(gpu: GPUSpec) -> bool:
    """Whether FlashAttention-2 runs on ``gpu``: NVIDIA compute capability 8.0 or newer
    (Ampere, Ada, Hopper, Blackwell; not Volta, Turing or Pascal), or an AMD ISA of
    `FLASH_ATTENTION_AMD_ISAS`. A GPU the catalog does not know (``"unknown"``, a bare
    device sheet) is given the benefit of the doubt."""
    cc = gpu.compute_capability
    if cc.startswith("gfx"):
        return cc in FLASH_ATTENTION_AMD_ISAS
    try:
        return int(cc.split(".")[0]) >= 8
    except ValueError:
        return True


@dataclass(frozen=True)
class Overlap:
    """How pipes and DRAM overlap (p-norm exponent) and the calibrated attention efficiency."""

    exponent: float
    efficiency: float
    launch_s: float


def pnorm(values: tuple[Any, ...], exponent: float) -> Any:
    """Times of pipes that overlap imperfectly, combined: their ``exponent``-norm (1 = they add
    up, infinity = the slowest alone). Scalars or NumPy arrays."""
    return sum(v**exponent for v in values) ** (1.0 / exponent)


def cycles_per_element(counts: PipeCounts, rates: SMRates, overlap: Overlap) -> float:
    """SM clocks per S element: the pipes' times combined, over the attention efficiency."""
    pipes = (
        counts.flops / rates.mma_flops_per_clk,
        counts.smem_bytes / SMEM_BYTES_PER_CLK_PER_SM,
        counts.mufu_ops / MUFU_PER_CLK_PER_SM + counts.fp32_ops / rates.fp32_lanes,
    )
    return pnorm(pipes, overlap.exponent) / overlap.efficiency


def causal_sweeps(s_q: int, s_kv: int, counts: PipeCounts, *, backward: bool) -> list[int]:
    """Blocks each CTA of one head visits under a causal mask, FA2's loop bounds (module
    docstring): forward per query block (``n_block_max``), backward per key block (from
    ``m_block_min``); a CTA whose rows are all masked visits none."""
    if backward:
        br, bc = counts.tile_cols, counts.tile_rows
        n_q = math.ceil(s_q / br)
        return [
            max(0, n_q - max(0, (j * bc + s_q - s_kv) // br)) for j in range(math.ceil(s_kv / bc))
        ]
    br, bc = counts.tile_rows, counts.tile_cols
    n_kv = math.ceil(s_kv / bc)
    return [
        min(n_kv, max(0, -(-((i + 1) * br + s_kv - s_q) // bc))) for i in range(math.ceil(s_q / br))
    ]


MAX_SPLITS = 128  # FA2: "num_splits > 128 not supported"


def splitkv_times_s(kernel: KernelSpec, rates: SMRates, overlap: Overlap) -> np.ndarray:
    """Seconds of a split-KV forward and its combine kernel at 2 .. `MAX_SPLITS` splits
    (module docstring): the busiest SM runs ``ceil(CTAs / SMs)`` CTAs of 64 query rows, each
    sweeping its chunk of ``ceil(blocks / n)`` key blocks; DRAM moves the kernel's bytes plus
    the fp32 partial outputs and log-sum-exps, written once and read once."""
    bh, s_q, s_kv, head_dim = kernel.dims
    d = kernel_head_dim(head_dim)
    br, bc = SPLITKV_BLOCK_M, splitkv_block_n(head_dim)
    counts = forward_tile_counts(d, br, bc, warps=4)
    n = np.arange(2, MAX_SPLITS + 1, dtype=np.float64)
    per_split = np.ceil(math.ceil(s_kv / bc) / n)  # key blocks of one chunk
    ctas = bh * math.ceil(s_q / br) * n
    tile_clk = br * per_split * bc * cycles_per_element(counts, rates, overlap)
    compute_s = np.ceil(ctas / rates.num_sms) * tile_clk / rates.clock_hz
    partial_bytes = 2.0 * n * bh * s_q * (d + 1) * 4  # fp32 O and LSE per split
    memory_s = (kernel.bytes() + partial_bytes) / rates.hbm_bytes_per_s
    return 2 * overlap.launch_s + pnorm((compute_s, memory_s), overlap.exponent)


def attention_kernel_s(kernel: KernelSpec, rates: SMRates, overlap: Overlap) -> float:
    """Seconds of one flash-attention-2 kernel (op ``attention``, ``attention_bwd`` or their
    causal twins ``attention_causal``, ``attention_causal_bwd``)."""
    bh, s_q, s_kv, head_dim = kernel.dims
    backward = kernel.op in ATTENTION_BACKWARD_OPS
    causal = kernel.op in CAUSAL_ATTENTION_OPS
    if backward:  # one CTA per Bc key rows sweeps all queries; + dO.O and dQ-convert kernels
        counts = backward_counts(head_dim, smem_bytes_per_block=rates.smem_bytes_per_block)
        tiled, swept, launches = s_kv, s_q, 3
    else:
        counts = forward_counts(head_dim, rates, causal=causal)
        tiled, swept, launches = s_q, s_kv, 1
    if causal:
        sweeps = causal_sweeps(s_q, s_kv, counts, backward=backward)
        busiest = max(math.ceil(bh * sum(sweeps) / rates.num_sms), max(sweeps))
        pair_clk = counts.tile_rows * counts.tile_cols * cycles_per_element(counts, rates, overlap)
        compute_s = busiest * pair_clk / rates.clock_hz
    else:
        ctas = bh * math.ceil(tiled / counts.tile_rows)
        swept_padded = math.ceil(swept / counts.tile_cols) * counts.tile_cols
        tile_clk = counts.tile_rows * swept_padded * cycles_per_element(counts, rates, overlap)
        compute_s = math.ceil(ctas / rates.num_sms) * tile_clk / rates.clock_hz
    memory_s = kernel.bytes() / rates.hbm_bytes_per_s
    one_pass = launches * overlap.launch_s + pnorm((compute_s, memory_s), overlap.exponent)
    if backward or s_q > SPLITKV_BLOCK_M:
        return one_pass
    return min(one_pass, float(splitkv_times_s(kernel, rates, overlap).min()))
