"""How often an FP32 GEMM forecast rises with a GPU's DRAM bandwidth, all else equal.

Run: ``python benchmarks/bandwidth_monotone.py [--gpus a100-sxm4-40gb,h100-sxm5-80gb]
[--shapes 3000] [--pair h200-sxm-141gb:h100-sxm5-80gb]``. For each GPU and GEMM family,
forecasts seeded random shapes (sides 64-16,384, bmm batches 1-64) on the catalog GPU with
its ``hbm_bw_bytes_per_s`` at 0.5, 1 and 2x, and prints the share of shapes whose forecast
rises at either step and the largest such rise; then the same for two catalog GPUs that
differ in their bandwidth alone (the H200 is an H100 SXM with 4.8 instead of 3.35 TB/s:
same SMs, clocks, L2 and board power). The README's limitation "FP32 GEMM forecasts are not
monotone in a GPU's DRAM bandwidth" quotes it; nothing is written.
"""

from __future__ import annotations

import argparse

import numpy as np

from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.tile_mlp import TileMLPModel

SCALES = (0.5, 1.0, 2.0)
RISE = 1.001  # a forecast this much above the one at less bandwidth counts as a rise


def random_gemms(family: OpFamily, n: int, seed: int) -> list[KernelSpec]:
    """``n`` seeded GEMMs of ``family``: sides log-uniform in 64-16,384, bmm batch 1-64."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = int(2 ** rng.uniform(0, 6)) if family is OpFamily.BMM else 1
        m, k_n, k = (int(2 ** rng.uniform(6, 14)) for _ in range(3))
        out.append(KernelSpec(family, (b, m, k_n, k), Dtype.FP32))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="a100-sxm4-40gb,h100-sxm5-80gb")
    ap.add_argument("--shapes", type=int, default=3000)
    ap.add_argument("--pair", default="h200-sxm-141gb:h100-sxm5-80gb", help="MORE_BW:LESS_BW")
    args = ap.parse_args()
    model = TileMLPModel.load()
    shapes = {f: random_gemms(f, args.shapes, seed=0) for f in (OpFamily.LINEAR, OpFamily.BMM)}
    print(f"{'gpu':18s} {'family':7s} {'rises':>6s} {'largest':>8s}")
    for gpu_id in args.gpus.split(","):
        gpu = load_gpu(gpu_id)
        gpus = [
            gpu.model_copy(update={"hbm_bw_bytes_per_s": gpu.hbm_bw_bytes_per_s * s})
            for s in SCALES
        ]
        for family, kernels in shapes.items():
            t = np.array([model.predict_s(kernels, g) for g in gpus])
            step = t[1:] / t[:-1]  # each doubling of the bandwidth
            rises = (step > RISE).any(axis=0)
            print(f"{gpu_id:18s} {family.value:7s} {rises.mean():6.1%} {step.max() - 1:+8.1%}")
    fast, slow = (load_gpu(g) for g in args.pair.split(":"))
    print(
        f"\n{fast.id} over {slow.id} (bandwidth {fast.hbm_bw_bytes_per_s / 1e12:g} vs "
        f"{slow.hbm_bw_bytes_per_s / 1e12:g} TB/s)"
    )
    for family, kernels in shapes.items():
        r = model.predict_s(kernels, fast) / model.predict_s(kernels, slow)
        print(
            f"{family.value:7s} slower on {fast.id}: {(r > RISE).mean():.1%} of shapes, "
            f"by at most {r.max() - 1:+.1%}; median ratio {np.median(r):.3f}"
        )


if __name__ == "__main__":
    main()
