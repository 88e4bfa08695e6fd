"""Batched kernel forecast speed: 100k kernels through tile-mlp, printed as kernels per second.

Target (issue: kernel forecaster): a 100k-kernel call under 2 s on 2 cores.
Run: python benchmarks/kernel_speed.py [--n 100000] [--gpu l4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from forecast.gpus import load_gpu
from forecast.kernels import ELEMENTWISE_OPS, KernelSpec, OpFamily
from forecast.predict import load_latency_model


def random_kernels(n: int, seed: int = 0) -> list[KernelSpec]:
    """n distinct-ish kernels, a fifth per trained family, transformer-like shapes."""
    rng = np.random.default_rng(seed)
    ops = list(ELEMENTWISE_OPS)
    out: list[KernelSpec] = []
    for i in range(n):
        kind = i % 5
        d = rng.integers(1, 8192, size=4)
        if kind == 0:
            out.append(KernelSpec(OpFamily.BMM, (int(d[0] % 512 + 1), *map(int, d[1:]))))
        elif kind == 1:
            out.append(KernelSpec(OpFamily.LINEAR, (1, *map(int, d[1:]))))
        elif kind == 2:
            op = ops[int(d[0]) % len(ops)]
            out.append(KernelSpec(OpFamily.ELEMENTWISE, (int(d[0]), int(d[1])), op=op))
        elif kind == 3:
            out.append(KernelSpec(OpFamily.SOFTMAX, (int(d[0]), int(d[1]))))
        else:
            out.append(KernelSpec(OpFamily.LAYERNORM, (int(d[0]), int(d[1]))))
    return out


def main() -> None:
    """Time one batched call and print kernels per second."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--gpu", default="l4")
    args = parser.parse_args()
    kernels = random_kernels(args.n)
    gpu = load_gpu(args.gpu)
    model = load_latency_model("tile-mlp")
    model.predict_s(kernels[:100], gpu)  # load and warm up
    t0 = time.perf_counter()
    model.predict_s(kernels, gpu)
    dt = time.perf_counter() - t0
    print(
        f"{args.n} kernels in {dt:.2f} s on {gpu.id}: {args.n / dt:,.0f} kernels/s (target < 2 s)"
    )


if __name__ == "__main__":
    main()
