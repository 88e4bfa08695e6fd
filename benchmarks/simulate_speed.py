"""Time one distributed-step simulation: GPT-3 175B on 1024 A100s, pp 16, 96 micro-batches.

Run: ``python benchmarks/simulate_speed.py [--repeats 10]``.
Target (issue: distributed simulator): at most 50 ms per layout once the kernel table exists.
Two figures: *cold*, the execution graph of the layout's shape built from nothing (caches
cleared before each repeat), the fair figure for a single layout; and *warm*, another layout of
a shape already built (a sweep's common case: its layouts share few shapes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from simulator.scenario import load_scenario, resolve
from simulator.simulate import clear_graph_caches, latency_table, simulate

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "gpt3_175b_a100.toml"
# tp 8 x pp 16 x dp 8, global batch 768 -> 96 micro-batches of 1 per pipeline, plain 1F1B.
OVERRIDES = ("run.schedule='1f1b'", "run.virtual_stages=1", "training.global_batch_size=768")


def main() -> None:
    """Print the table time once and the simulate time per layout (mean and median), in ms."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--latency-model", default="auto")
    args = parser.parse_args()
    lm = f"training.latency_model='{args.latency_model}'"
    scenario = load_scenario(SCENARIO, overrides=(*OVERRIDES, lm))
    inputs = resolve(scenario)
    t0 = time.perf_counter()
    table = latency_table(inputs, [scenario.run])
    t1 = time.perf_counter()
    cold, warm = [], []
    for _ in range(args.repeats):
        clear_graph_caches()
        c0 = time.perf_counter()
        simulate(inputs, scenario.run, table)
        cold.append(time.perf_counter() - c0)
    for _ in range(args.repeats):
        w0 = time.perf_counter()
        result = simulate(inputs, scenario.run, table)
        warm.append(time.perf_counter() - w0)
    print(
        f"kernel table {(t1 - t0) * 1e3:.0f} ms; simulate per layout, mean (median) of "
        f"{args.repeats}: cold {statistics.mean(cold) * 1e3:.1f} ms "
        f"({statistics.median(cold) * 1e3:.1f}), warm {statistics.mean(warm) * 1e3:.1f} ms "
        f"({statistics.median(warm) * 1e3:.1f}) ({result.graph_nodes} graph nodes, "
        f"{result.num_micro_batches} micro-batches)"
    )


if __name__ == "__main__":
    main()
