"""FlashAttention-2's tiles on a GPU and the work per element of ``S = Q K^T`` that a tile puts
on each pipe (tensor, shared memory, special functions and FP32: `forecast.flash_attention`
states what each pipe counts, and times them).

The kernels and their tiles are those of Dao-AILab/flash-attention 2.x
(``csrc/flash_attn/src``: ``flash_fwd_launch_template.h``, ``flash_bwd_launch_template.h``,
``kernel_traits.h``, ``flash_bwd_kernel.h``; split-KV: ``set_params_splitkv`` in
``csrc/flash_attn/flash_api.cpp``).

The tiles are FA2's for the GPU: by head dim, and where FA2's launchers ask the device, by
its shared memory per block (the catalog's per SM less the 1 KB CUDA reserves; backward head
dims 64 and 128 under 144 KiB, forward head dim 256 under 128 KiB or from 192 KiB an SM) and
by sm86/sm89 (forward head dims 96 and 128); the big-memory tiles were charged everywhere,
the L4's and L40S's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_HEAD_DIM = 256
# Forward tiles by head dim: (Br query rows, Bc key rows, warps); one warp per Br / warps rows.
FWD_TILES: dict[int, tuple[int, int, int]] = {
    32: (128, 128, 4),
    64: (128, 128, 4),
    96: (128, 64, 4),
    128: (128, 64, 4),
    192: (128, 64, 8),
    256: (128, 64, 8),  # only with >= 128 KiB a block and < 192 KiB an SM; else 64 x 64, 4 warps
}
# sm86/sm89 (compute capability 8.x but 8.0: L4, L40S) forward tiles where they differ:
# (head dim, causal) -> tile; "128 x 32 (48 KB smem) is the fastest for non-causal since we
# get 2 CTAs per SM", 64 x 64 for causal "because it's square" (flash_fwd_launch_template.h).
SM8X_FWD_TILES: dict[tuple[int, bool], tuple[int, int, int]] = {
    (96, True): (64, 64, 4),
    (128, False): (128, 32, 4),
    (128, True): (64, 64, 4),
}
# Backward tiles (GPUs with >= 144 KiB shared memory per block: A100, H100/H200):
# (Br, Bc, warps, warps along M of the S/dP, dK/dV and dQ matmuls).
BWD_TILES: dict[int, tuple[int, int, int, int, int, int]] = {
    32: (128, 128, 8, 4, 4, 4),
    64: (128, 128, 8, 4, 4, 4),
    96: (64, 128, 8, 2, 4, 4),
    128: (64, 128, 8, 2, 4, 2),
    192: (64, 64, 8, 4, 2, 2),
    256: (64, 64, 8, 4, 2, 2),
}
# Backward tiles where a block gets less than 144 KiB (L4, L40S; V kept in registers, whose
# saved shared-memory reads are not counted, as for head dim 32 above).
SMALL_SMEM_BWD_TILES: dict[int, tuple[int, int, int, int, int, int]] = {
    64: (64, 128, 8, 2, 4, 4),
    128: (64, 64, 8, 4, 2, 2),
}
BWD_BIG_BLOCK_SMEM_BYTES = 144 * 1024  # FA2's backward switch for head dims 64 and 128
FWD256_BLOCK_SMEM_BYTES = 2 * 256 * (128 + 2 * 64)  # 128 KiB: hdim-256 forward at 128 x 64
BIG_SMEM_BYTES_PER_SM = 4 * 256 * (64 + 2 * 64)  # 192 KiB an SM: hdim 256 runs 64 x 64 twice
RESERVED_SMEM_BYTES_PER_BLOCK = 1024  # CUDA guide: per-block opt-in = per-SM capacity - 1 KB


@dataclass(frozen=True)
class SMRates:
    """One GPU's per-SM throughputs per clock, the clock, and what the whole GPU adds."""

    clock_hz: float
    mma_flops_per_clk: float  # achieved: catalog peak x level
    fp32_lanes: float
    num_sms: int
    smem_bytes_per_sm: float  # capacity: FA2 picks some tiles by it (0: unknown, small)
    hbm_bytes_per_s: float  # achieved DRAM bandwidth
    sm8x: bool = False  # compute capability 8.x but 8.0: FA2's sm86/sm89 forward tiles

    @property
    def smem_bytes_per_block(self) -> float:
        """Most shared memory one CTA may take (``cudaDevAttrMaxSharedMemoryPerBlockOptin``)."""
        return self.smem_bytes_per_sm - RESERVED_SMEM_BYTES_PER_BLOCK


@dataclass(frozen=True)
class PipeCounts:
    """Work per element of S on each pipe, and the tile one CTA owns."""

    flops: float
    smem_bytes: float
    mufu_ops: float
    fp32_ops: float
    tile_rows: int  # Br forward (query rows), Bc backward (key rows)
    tile_cols: int  # the other block size, for padding the swept length


def kernel_head_dim(head_dim: int) -> int:
    """The head dim flash-attention compiles for ``head_dim`` (the next one up)."""
    for d in sorted(FWD_TILES):
        if head_dim <= d:
            return d
    raise ValueError(
        f"head dim {head_dim}: flash-attention 2 supports head dims up to {MAX_HEAD_DIM}; "
        f"use a head dim of at most {MAX_HEAD_DIM}"
    )


def forward_tile(d: int, rates: SMRates, *, causal: bool = False) -> tuple[int, int, int]:
    """FA2's forward tile (Br, Bc, warps) at kernel head dim ``d`` on this GPU: by head dim,
    by shared memory at head dim 256, by sm86/sm89 at 96 and 128 (``run_mha_fwd_hdim*``)."""
    if d == MAX_HEAD_DIM:
        two_ctas = rates.smem_bytes_per_sm >= BIG_SMEM_BYTES_PER_SM
        fits = rates.smem_bytes_per_block >= FWD256_BLOCK_SMEM_BYTES
        return FWD_TILES[d] if fits and not two_ctas else (64, 64, 4)
    if rates.sm8x and (d, causal) in SM8X_FWD_TILES:
        return SM8X_FWD_TILES[d, causal]
    return FWD_TILES[d]


def forward_counts(head_dim: int, rates: SMRates, *, causal: bool = False) -> PipeCounts:
    """Forward pipe work per S element (FA2 ``flash_fwd_kernel``, Q reloaded per K tile)."""
    d = kernel_head_dim(head_dim)
    return forward_tile_counts(d, *forward_tile(d, rates, causal=causal))


def forward_tile_counts(d: int, br: int, bc: int, warps: int) -> PipeCounts:
    """Forward pipe work per S element of a ``br x bc`` tile swept by ``warps`` warps at
    kernel head dim ``d`` (the one-pass and the split-KV kernels alike)."""
    ldmatrix = 2.0 * d * (br + 2 * warps * bc)  # each warp: its Q rows, all of K and V
    cp_async = 2.0 * 2 * bc * d  # K and V tiles into shared memory
    smem = (ldmatrix + cp_async) / (br * bc)
    return PipeCounts(4.0 * d, smem, 1.0 + 1.0 / bc, 3.5 + d / bc, br, bc)


def backward_counts(head_dim: int, *, smem_bytes_per_block: float = math.inf) -> PipeCounts:
    """Backward pipe work per S element (FA2 ``compute_dq_dk_dv_1colblock``, seq-parallel);
    head dims 64 and 128 take smaller tiles where a block gets under 144 KiB."""
    d = kernel_head_dim(head_dim)
    br, bc, warps, m_sdp, m_dkv, m_dq = BWD_TILES[d]
    if smem_bytes_per_block < BWD_BIG_BLOCK_SMEM_BYTES and d in SMALL_SMEM_BWD_TILES:
        br, bc, warps, m_sdp, m_dkv, m_dq = SMALL_SMEM_BWD_TILES[d]
    s_dp = 2 * warps * 2.0 * d * (br / m_sdp + bc * m_sdp / warps)  # S = Q K^T, dP = dO V^T
    dk_dv = 2 * warps * 2.0 * br * (bc / m_dkv + d * m_dkv / warps)  # dV = P^T dO, dK = dS^T Q
    d_q = warps * 2.0 * bc * (br / m_dq + d * m_dq / warps)  # dQ = dS K
    writes = 2.0 * 2 * br * bc + 2.0 * 2 * br * d  # P, dS; Q, dO by cp.async
    smem = (s_dp + dk_dv + d_q + writes) / (br * bc)
    return PipeCounts(10.0 * d, smem, 1.0, 4.0, bc, br)


SPLITKV_BLOCK_M = 64  # query rows of a split-KV CTA (FA2's run_mha_fwd_splitkv_dispatch)


def splitkv_block_n(head_dim: int) -> int:
    """Key rows per split-KV tile: FA2's ``block_n`` for the head dim."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64
