"""Does the tiered search find what simulating every layout finds?

Run: ``python benchmarks/screen_recall.py [SCENARIO ...]`` (default: every shipped scenario).
For each scenario it screens every valid layout, then simulates every layout that fits as a
full execution graph (what `tilesim sweep --candidates` larger than the space does), and
compares with the layouts the sweep's default tiering simulates (the screen's best
`TOP_CANDIDATES` plus `PER_CONTEXT` per cluster). Printed per scenario: the layouts that fit,
the exhaustive best, the tiered best's tokens/s over the exhaustive best's, where the
exhaustive best sits in the screen's order, how many of the exhaustive top 10 the tiering
simulated, and Spearman's rank correlation of screen and full tokens/s. ``--all`` also
simulates the layouts the screen found too large and counts where the two tiers disagree on
whether a layout fits. ``--all`` over the shipped scenarios (3,116 layouts) takes about 30 s on
one core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm

from simulator.rows import Row
from simulator.scenario import load_scenario
from simulator.space import enumerate_space, find_scenario, point_keys, shipped_scenarios
from simulator.sweep import run_sweep
from simulator.sweep_eval import PER_CONTEXT, TOP_CANDIDATES, build_shared, select_candidates


def _ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(np.float64)


def recall(scenario_id: str, *, all_layouts: bool = False) -> str:
    """One line comparing tiered and exhaustive search on a shipped scenario."""
    scenario = load_scenario(find_scenario(scenario_id))
    space = enumerate_space(scenario)
    shared = build_shared(space, scenario.run)
    t0 = time.perf_counter()
    screened = run_sweep("screen", space.points, shared, chunk_size=500)
    by_key = {r["key"]: r for r in screened}  # rows come back sorted by key, not in order
    keys = point_keys(space.points, space.contexts)
    fitting = [p for p, k in zip(space.points, keys, strict=True) if by_key[k]["status"] == "ok"]
    if all_layouts:  # also the ones the screen found too large, to count memory disagreements
        fitting = list(space.points)
    full: list[Row] = []
    for i in tqdm(range(0, len(fitting), 20), desc=scenario_id, unit="chunk", leave=False):
        full += run_sweep("simulate", fitting[i : i + 20], shared, chunk_size=20)
    ok = [r for r in full if r["status"] == "ok"]
    disagree = sum((r["status"] == "ok") != (by_key[r["key"]]["status"] == "ok") for r in full)
    if not ok:
        return f"{scenario_id}: no layout fits"
    tiered = set(select_candidates(screened, top=TOP_CANDIDATES, per_context=PER_CONTEXT))
    best = max(ok, key=lambda r: (r["tokens_per_s"], r["key"]))
    tiered_best = max((r for r in ok if r["key"] in tiered), key=lambda r: r["tokens_per_s"])
    screen_order = sorted(ok, key=lambda r: (-by_key[r["key"]]["screen_tokens_per_s"], r["key"]))
    rank = [r["key"] for r in screen_order].index(best["key"]) + 1
    top10 = sorted(ok, key=lambda r: -r["tokens_per_s"])[:10]
    s = np.array([by_key[r["key"]]["screen_tokens_per_s"] for r in ok])
    f = np.array([r["tokens_per_s"] for r in ok])
    rho = float(np.corrcoef(_ranks(s), _ranks(f))[0, 1]) if len(ok) > 1 else 1.0
    return (
        f"{scenario_id}: {len(ok)} of {len(space.points)} layouts fit "
        f"(all simulated in {time.perf_counter() - t0:.0f} s"
        + (f"; fits by screen and full simulation disagree on {disagree}" if all_layouts else "")
        + f"); the tiering simulated "
        f"{len(tiered)}; its best / the exhaustive best = "
        f"{tiered_best['tokens_per_s'] / best['tokens_per_s']:.4f}; the exhaustive best is "
        f"#{rank} of the screen; exhaustive top 10 simulated by the tiering: "
        f"{sum(r['key'] in tiered for r in top10)}/{len(top10)}; Spearman (screen vs full "
        f"tokens/s) {rho:.3f}; screen/full tokens/s median {np.median(s / f):.3f} "
        f"(5-95%: {np.percentile(s / f, 5):.3f}-{np.percentile(s / f, 95):.3f})"
    )


def main() -> None:
    """Print one recall line per scenario."""
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="*", help="shipped ids (default: all)")
    parser.add_argument(
        "--all", action="store_true", help="also simulate the layouts the screen found too large"
    )
    args = parser.parse_args()
    for sid in args.scenarios or shipped_scenarios():
        print(recall(sid, all_layouts=args.all), flush=True)


if __name__ == "__main__":
    main()
