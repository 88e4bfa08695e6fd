"""The optimizer step's cost per parameter: its HBM traffic, priced as a streaming copy."""

from __future__ import annotations

from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.predict import LatencyTable

# The optimizer step streams every local parameter's state through HBM; bytes per parameter
# for Megatron-LM's mixed-precision optimizer with apex FusedAdam (fp32 p, g, m, v read, p, m,
# v written: 28 B) plus, for fp16, the 16-bit grad -> fp32 main grad cast (6 B) and the
# loss-scale unscale/inf check (8 B); the grad-norm read (4 B); the fp32 -> 16-bit weight copy
# (6 B); zeroing the grad buffer (2 B fp16, 4 B fp32). fp32 training: norm, Adam, zeroing.
# fp8 (TransformerEngine) is bf16's plus the weights' fp8 cast and transpose, once a step (on
# the first micro-batch, ``is_first_microbatch``): the bf16 weight read, two fp8 copies
# written (4 B; counted on every parameter, the GEMM weights being nearly all of them).
OPTIMIZER_BYTES_PER_PARAM: dict[Dtype, float] = {
    Dtype.FP16: 6 + 8 + 4 + 28 + 6 + 2,
    Dtype.BF16: 4 + 28 + 6 + 4,
    Dtype.FP8: 4 + 28 + 6 + 4 + 4,
    Dtype.FP32: 4 + 28 + 4,
    Dtype.TF32: 4 + 28 + 4,
}
# Priced at the bandwidth of a long streaming copy (512 MiB of traffic: multi-tensor apply
# works over all parameters, far from launch-bound).
ADAM_REF = KernelSpec(OpFamily.MEMORY, (1024, 65536), Dtype.FP32, "copy")


def optimizer_s_per_param(bytes_per_param: float, table: LatencyTable) -> float:
    """Seconds of the optimizer step per local parameter at ``bytes_per_param`` of traffic."""
    return bytes_per_param * table[ADAM_REF] / ADAM_REF.bytes()
