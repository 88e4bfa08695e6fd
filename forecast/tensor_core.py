"""TensorCoreModel: an analytic tile/wave model of tensor-core GEMMs and flash attention.

GEMM (bmm, linear) in tf32/fp16/bf16/fp8, the way CUTLASS/cuBLAS kernels run them:

* the output is cut into CTA tiles (``TILES``: 256x128 ... 64x64), one CTA per SM at a
  time; the reduction is walked in k-tiles of 64 bytes (Ampere) or 128 bytes (Hopper and
  later) a row, so K is rounded up to a k-tile; a narrow dtype may also take a wider one's
  depth in elements where that is whole MMAs (fp8 on Hopper: 128, 64 or 32), so a short
  reduction is not padded further than in bf16 or tf32, which made it slower than those
  (H200 bmm 8,8192,1,257: fp8 4% over bf16); small outputs may split K (2 or 4 ways);
* waves = ceil(CTAs / SMs): a partial last wave costs a whole wave (wave quantisation);
* a CTA's main loop runs at ``peak / SMs x level x tile_efficiency``: ``level`` is the
  achieved fraction of the catalog's dense peak, smaller tiles re-read more operands per
  FLOP (``small_tile_penalty``), and each tile pays ``tile_overhead_cycles`` (pipeline
  fill of its first k-tiles and the epilogue);
* fp8 pays the FP32 promotion of its accumulators: every 128 reduction elements (CUTLASS's
  default promotion interval, without "fast accumulation") each accumulator gets one FADD
  on the CUDA cores, which costs ``peak_fp8 / (128 x peak_fp32)`` of the main loop. CUTLASS
  promotes on Hopper (its own sm90 fp8 mainloop, ``GmmaFP8Accumulation``: the MMA keeps about
  14 bits of the sum) and Ada (sm89 staged accumulation), not on Blackwell, whose fp8 GEMMs
  run the generic sm100 mainloop, accumulating in tensor memory (`fp8_promotes`; a B200 fp8
  GEMM was forecast at 53% of its fp8 peak against 79% in bf16);
* compute and DRAM time combine as a p-norm (``overlap_exponent``; p -> inf is max);
  fp8 GEMMs write bf16 outputs.

Attention (flash-attention 2, forward op ``attention`` and backward op ``attention_bwd``,
non-causal, and their causal twins ``attention_causal``, ``attention_causal_bwd``, fp16/bf16):
`forecast.flash_attention`, FA2's own tiles on the tensor, shared-memory and
special-function/FP32 pipes of an SM (no Hopper discount for ``mma.sync``: see that module);
calibrated on non-causal figures only, the causal ops visit fewer tiles at the same costs.

The fitted constants live in ``data/tensor_core.toml``, written by `calibrate` from
measurements only (``shared/data/hardware/microbenchmarks.json``; H100 records are never
read: H100 is the project's blind held-out GPU).
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from forecast.files import write_text_atomic
from forecast.flash_attention import (
    FLASH_ATTENTION_AMD_ISAS,
    Overlap,
    attention_kernel_s,
    has_flash_attention,
    pnorm,
)
from forecast.flash_tiles import SMRates, kernel_head_dim
from forecast.gpus import GPUSpec
from forecast.kernels import GEMM_FAMILIES, Dtype, KernelSpec, OpFamily

F64 = npt.NDArray[np.float64]
PARAMS_FILE = Path(__file__).parent / "data" / "tensor_core.toml"
TENSOR_DTYPES = frozenset({Dtype.TF32, Dtype.FP16, Dtype.BF16, Dtype.FP8})
ATTENTION_DTYPES = frozenset({Dtype.FP16, Dtype.BF16})
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SPLITS = (1, 2, 4)
FP8_PROMOTION_ELEMS = 128  # CUTLASS sm90 FP8 mma_promotion_interval (4 MMAs of k=32)
SPLIT_ACC_BYTES = 4  # split-K partials are fp32
MMA_K_BYTES = 32.0  # one MMA's reduction depth: k = 8 tf32, 16 fp16/bf16, 32 fp8 elements
# Dense fp16/bf16 tensor FLOPs per clock per SM: A100 whitepaper (1024 FMA/clk/SM); H100
# whitepaper (2x A100 per SM, clock for clock). Unknown architectures use the boost clock.
MMA_FLOPS_PER_CLK_PER_SM = {"8.0": 2048.0, "9.0": 4096.0}


class TensorCoreError(ValueError):
    """A kernel this model cannot forecast (family or dtype); the message names the fix."""


@dataclass(frozen=True)
class TCParams:
    """Calibrated constants (see module docstring); SI units or dimensionless."""

    level: float = 0.8
    launch_s: float = 4e-6
    tile_overhead_cycles: float = 1000.0
    small_tile_penalty: float = 0.1
    overlap_exponent: float = 2.0
    hbm_efficiency: float = 0.85
    fa_efficiency: float = 1.0  # flash attention: achieved / modelled pipe throughput
    fp8_promotion_overlap: float = 0.0  # prior: promotion FADDs not hidden behind MMAs
    calibrated_on: str = "defaults"


def load_params(path: Path = PARAMS_FILE) -> TCParams:
    """Read calibrated constants from TOML (defaults when the file is absent)."""
    if not path.is_file():
        return TCParams()
    with path.open("rb") as f:
        raw = tomllib.load(f)
    return TCParams(**raw["params"])


def save_params(params: TCParams, path: Path, comment: str) -> None:
    """Write constants as TOML with a provenance comment."""
    lines = [f"# {line}" for line in comment.splitlines()] + ["", "[params]"]
    for key, value in asdict(params).items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value!r}")
    write_text_atomic(path, "\n".join(lines) + "\n")


def _is_hopper_or_later(gpu: GPUSpec) -> bool:
    try:
        return float(gpu.compute_capability) >= 9.0
    except ValueError:
        return False


def fp8_promotes(gpu: GPUSpec) -> bool:
    """Whether fp8 GEMMs promote their accumulators on the CUDA cores: not from Blackwell
    (compute capability 10.0) on, whose ``tcgen05`` MMAs accumulate in tensor memory and
    CUTLASS's sm100 fp8 mainloop has no promotion step; AMD ids keep the prior."""
    try:
        return float(gpu.compute_capability) < 10.0
    except ValueError:
        return True


def fp8_factor(gpu: GPUSpec, params: TCParams) -> float:
    """Main-loop slowdown of fp8 from FP32 promotion of the accumulators (<= 1)."""
    if not fp8_promotes(gpu):
        return 1.0
    ratio = gpu.peak_for(Dtype.FP8) / (FP8_PROMOTION_ELEMS * gpu.peak_for(Dtype.FP32))
    return 1.0 / (1.0 + ratio * (1.0 - params.fp8_promotion_overlap))


@dataclass(frozen=True)
class GemmShape:
    """Batched GEMMs in output/reduction terms: batch x (rows x cols), reduction ``red``."""

    batch: F64
    rows: F64
    cols: F64
    red: F64
    itemsize: F64  # input bytes per element
    dram_bytes: F64  # inputs read once, output written once
    flops_per_clk: F64  # achieved main-loop FLOPs per clock per SM (level and dtype applied)


def sm_flops_per_clk(gpu: GPUSpec, dtype: Dtype, params: TCParams) -> float:
    """Main-loop FLOPs per clock of one SM: catalog peak x level (x fp8 promotion)."""
    rate = gpu.peak_for(dtype) / (gpu.num_sms * gpu.boost_clock_hz) * params.level
    return rate * fp8_factor(gpu, params) if dtype is Dtype.FP8 else rate


def gemm_shape(kernels: list[KernelSpec], gpu: GPUSpec, params: TCParams) -> GemmShape:
    """bmm (B,M,N,K): B x (M x K), reduce N; linear (B,M,N,K): (B*M x K), reduce N."""
    d = np.array([k.dims for k in kernels], dtype=np.float64)
    linear = np.array([k.family is OpFamily.LINEAR for k in kernels])
    batch = np.where(linear, 1.0, d[:, 0])
    rows = np.where(linear, d[:, 0] * d[:, 1], d[:, 1])
    item = np.array([k.itemsize_bytes for k in kernels], dtype=np.float64)
    out_item = np.array([2.0 if k.dtype is Dtype.FP8 else k.itemsize_bytes for k in kernels])
    dram = batch * (item * (rows * d[:, 2] + d[:, 2] * d[:, 3]) + out_item * rows * d[:, 3])
    rate = np.array([sm_flops_per_clk(gpu, k.dtype, params) for k in kernels])
    return GemmShape(batch, rows, d[:, 3], d[:, 2], item, dram, rate)


def _combine_s(compute_s: F64, memory_s: F64, params: TCParams) -> F64:
    return np.asarray(pnorm((compute_s, memory_s), params.overlap_exponent), dtype=np.float64)


def k_tiles(shape: GemmShape, gpu: GPUSpec) -> list[F64]:
    """Reduction depths (elements) a k-tile may have: the arch's bytes per row over the
    itemsize, or the depth of a wider dtype's kernels where that is whole MMAs (32 bytes)."""
    row_bytes = 128.0 if _is_hopper_or_later(gpu) else 64.0
    mma_k = MMA_K_BYTES / shape.itemsize
    return [np.maximum(row_bytes / np.maximum(w, shape.itemsize), mma_k) for w in (1.0, 2.0, 4.0)]


def gemm_latency_s(shape: GemmShape, gpu: GPUSpec, params: TCParams) -> F64:
    """Seconds of each GEMM at its fastest (tile, split-K, k-tile) choice."""
    pen = params.small_tile_penalty
    bw = gpu.hbm_bw_bytes_per_s * params.hbm_efficiency
    best = np.full(len(shape.rows), np.inf)
    for tm, tn in TILES:
        eff = (1.0 + pen * (64 / 256 + 64 / 128)) / (1.0 + pen * (64 / tm + 64 / tn))
        for split in SPLITS:
            ctas = shape.batch * np.ceil(shape.rows / tm) * np.ceil(shape.cols / tn) * split
            k_len = np.minimum.reduce(
                [np.ceil(shape.red / split / kt) * kt for kt in k_tiles(shape, gpu)]
            )
            tile_cycles = 2.0 * tm * tn * k_len / (shape.flops_per_clk * eff)
            waves = np.ceil(ctas / gpu.num_sms)
            compute_s = waves * (tile_cycles + params.tile_overhead_cycles) / gpu.boost_clock_hz
            partials = 0.0 if split == 1 else 2.0 * split * SPLIT_ACC_BYTES
            nbytes = shape.dram_bytes + partials * shape.batch * shape.rows * shape.cols
            best = np.minimum(best, _combine_s(compute_s, nbytes / bw, params))
    return np.asarray(params.launch_s + best, dtype=np.float64)


def tensor_clock_hz(gpu: GPUSpec, dtype: Dtype) -> float:
    """Clock at which the catalog's tensor peak is quoted (boost clock if the width is unknown)."""
    width = MMA_FLOPS_PER_CLK_PER_SM.get(gpu.compute_capability)
    return gpu.peak_for(dtype) / (gpu.num_sms * width) if width else gpu.boost_clock_hz


def sm_rates(gpu: GPUSpec, dtype: Dtype, params: TCParams) -> SMRates:
    """Per-SM pipe rates that flash attention (mma.sync) reaches on this GPU."""
    clock_hz = tensor_clock_hz(gpu, dtype)
    return SMRates(
        clock_hz=clock_hz,
        mma_flops_per_clk=gpu.peak_for(dtype) * params.level / (gpu.num_sms * clock_hz),
        fp32_lanes=float(gpu.fp32_lanes_per_sm),
        num_sms=gpu.num_sms,
        smem_bytes_per_sm=gpu.smem_bytes_per_sm or 0.0,
        hbm_bytes_per_s=gpu.hbm_bw_bytes_per_s * params.hbm_efficiency,
        sm8x=gpu.compute_capability.startswith("8.") and gpu.compute_capability != "8.0",
    )


def attention_latency_s(kernels: list[KernelSpec], gpu: GPUSpec, params: TCParams) -> F64:
    """Seconds of flash-attention-2 kernels (dims BH, S_q, S_kv, D; forward or backward)."""
    overlap = Overlap(params.overlap_exponent, params.fa_efficiency, params.launch_s)
    return np.array(
        [attention_kernel_s(k, sm_rates(gpu, k.dtype, params), overlap) for k in kernels],
        dtype=np.float64,
    )


class TensorCoreModel:
    """Tensor-core GEMM (bmm, linear) and attention latency; satisfies `LatencyModel`."""

    name = "tensor-core"

    def __init__(self, params: TCParams | None = None) -> None:
        self.params = params or load_params()

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> F64:
        """Seconds per kernel, in input order; unsupported family/dtype/GPU pairs raise."""
        out = np.empty(len(kernels), dtype=np.float64)
        gemm = [i for i, k in enumerate(kernels) if k.family in GEMM_FAMILIES]
        attn = [i for i, k in enumerate(kernels) if k.family is OpFamily.ATTENTION]
        for k in kernels:
            _check(k, gpu)
        if gemm:
            batch = [kernels[i] for i in gemm]
            out[gemm] = gemm_latency_s(gemm_shape(batch, gpu, self.params), gpu, self.params)
        if attn:
            out[attn] = attention_latency_s([kernels[i] for i in attn], gpu, self.params)
        return out


def _check(k: KernelSpec, gpu: GPUSpec) -> None:
    if k.family is OpFamily.ATTENTION:
        if not has_flash_attention(gpu):
            raise TensorCoreError(
                f"op {k.op or 'attention'}: FlashAttention-2 has no kernels for {gpu.id} "
                f"(compute capability {gpu.compute_capability}; it needs 8.0+ or AMD "
                f"{'/'.join(sorted(FLASH_ATTENTION_AMD_ISAS))}); there attention runs unfused: "
                "price its bmm and softmax kernels"
            )
        if k.dtype not in ATTENTION_DTYPES:
            raise TensorCoreError(
                f"dtype {k.dtype.value}: attention is modelled in fp16/bf16 only; use fp16 or bf16"
            )
        try:
            kernel_head_dim(k.dims[3])
        except ValueError as e:
            raise TensorCoreError(str(e)) from e
    elif k.family not in GEMM_FAMILIES:
        raise TensorCoreError(
            f"op {k.op}: {k.family.value} does not run on tensor cores; use the auto latency "
            "model, which routes it to the fp32 or bandwidth model"
        )
    elif k.dtype not in TENSOR_DTYPES:
        raise TensorCoreError(
            f"dtype {k.dtype.value}: not a tensor-core dtype; use one of "
            + ", ".join(sorted(d.value for d in TENSOR_DTYPES))
        )
    gpu.peak_for(k.dtype)  # GPUError for pairs the GPU lacks (fp8 on A100)
    if k.dtype is Dtype.FP8:
        gpu.peak_for(Dtype.FP32)
