"""Time one GPT-3 175B training-step forecast: cold (op graph + kernel forecasts) and cached.

Run: ``python benchmarks/e2e_speed.py [--latency-model tile-mlp|roofline]``.
Targets: under 1 s cold, under 50 ms with the kernel table cached.
"""

from __future__ import annotations

import argparse
import time

from forecast.gpus import load_gpu
from forecast.predict import forecast_table, load_latency_model
from simulator.e2e import FITTED, predict_graph
from simulator.models import load_model
from simulator.opgraph import Workload, build_ops


def main() -> None:
    """Print cold and cached times in ms."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-model", default="tile-mlp")
    args = parser.parse_args()
    model, gpu = load_model("gpt3-175b"), load_gpu("a100-sxm4-80gb")
    run = Workload(batch=1, seq=2048, mode="train", framework="megatron")
    latency_model = load_latency_model(args.latency_model)
    t0 = time.perf_counter()
    graph = build_ops(model, run)
    table = forecast_table(graph.kernels(), gpu, latency_model)
    predict_graph(graph, table, FITTED)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(10):
        predict_graph(build_ops(model, run), table, FITTED)
    cached = (time.perf_counter() - t0) / 10
    print(f"cold {cold * 1e3:.1f} ms (target < 1000), cached {cached * 1e3:.2f} ms (target < 50)")


if __name__ == "__main__":
    main()
