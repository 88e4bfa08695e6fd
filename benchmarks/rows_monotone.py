"""How often an FP32 GEMM forecast falls as its rows grow, all else equal.

Run: ``python benchmarks/rows_monotone.py [--gpus h100-sxm5-80gb,a100-pcie-80gb,l4]
[--series 300] [--candidates 1,4,16]``. For each GPU and GEMM family, takes seeded GEMMs (output
and reduction sides log-uniform in 256-16,384, bmm batches 1-64) and forecasts each with its
rows ``M`` from 16 to 4,096 in steps of 16 (a sequence growing token by token, in the
granularity of a tile edge); prints the share of series whose forecast falls somewhere by
more than 1% and by more than 5% as ``M`` grows, and the largest fall, for each number of
candidate tiles (`forecast.tile_mlp.TileMLPModel.tile_candidates`: 1 = the nearest measured
shape's tile alone; shipped: `forecast.tile_mlp.TILE_CANDIDATES`). The README's limitation on GEMM
forecasts that fall as a shape grows quotes it; nothing is written.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from forecast.gpus import load_gpu
from forecast.kernels import Dtype, KernelSpec, OpFamily
from forecast.tile_mlp import TileMLPModel

ROWS = np.arange(16, 4097, 16)
FALLS = (0.99, 0.95)  # a forecast below these shares of the one at fewer rows: a fall


def random_sides(family: OpFamily, n: int, seed: int) -> list[tuple[int, int, int]]:
    """``n`` seeded ``(B, N, K)``: sides log-uniform in 256-16,384, bmm batch 1-64."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = int(2 ** rng.uniform(0, 6)) if family is OpFamily.BMM else 1
        n_, k = (int(2 ** rng.uniform(8, 14)) for _ in range(2))
        out.append((b, n_, k))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h100-sxm5-80gb,a100-pcie-80gb,l4")
    ap.add_argument("--series", type=int, default=300)
    ap.add_argument("--candidates", default="1,4,16")
    args = ap.parse_args()
    shipped = TileMLPModel.load()
    counts = [int(c) for c in args.candidates.split(",")]
    heads = "".join(f" {'falls>' + format(1 - f, '.0%'):>9s}" for f in FALLS)
    print(f"{'gpu':16s} {'family':7s} {'tiles':>5s}{heads} {'largest':>8s}")
    for gpu_id in args.gpus.split(","):
        gpu = load_gpu(gpu_id)
        for family in (OpFamily.LINEAR, OpFamily.BMM):
            sides = random_sides(family, args.series, seed=0)
            kernels = [
                KernelSpec(family, (b, int(m), n, k), Dtype.FP32) for b, n, k in sides for m in ROWS
            ]
            for count in counts:
                model = replace(shipped, tile_candidates=count)
                t = model.predict_s(kernels, gpu).reshape(len(sides), len(ROWS))
                step = t[:, 1:] / t[:, :-1]
                shares = "".join(f" {(step < f).any(axis=1).mean():9.1%}" for f in FALLS)
                print(f"{gpu_id:16s} {family.value:7s} {count:5d}{shares} {step.min() - 1:+8.1%}")


if __name__ == "__main__":
    main()
