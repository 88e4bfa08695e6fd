"""What a chunk of layouts becomes: `evaluate_chunk(tier, points, shared)` -> rows.

The ``screen`` tier prices each layout with the closed form (`screen`), the ``simulate`` tier
with `simulate`. It is a pure function of its arguments (the per-process screen caches hold
values only), so every executor of `sweep.run_sweep` gives identical rows. `Shared` is what
every chunk needs (contexts, one kernel table per context), built once in the driver;
`candidate_points` picks the screened layouts the simulate tier runs.
"""

from __future__ import annotations

import math
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from forecast.predict import LatencyTable
from simulator.errors import InfeasibleConfig
from simulator.parallel import RunConfig
from simulator.rows import Row, add_training_cost, blank_row, finite_problem
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, simulate
from simulator.space import Point, Space, point_keys
from simulator.sweep_table import Context

Tier = Literal["screen", "simulate"]


@dataclass(frozen=True)
class Shared:
    """What every chunk needs: contexts, one kernel table per context, the base run."""

    contexts: tuple[Context, ...]
    tables: tuple[LatencyTable, ...]
    base_run: RunConfig
    train_tokens: float | None
    # This sweep's identity in a worker's screen caches (`screen_cache`); not part of any row.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


def build_shared(space: Space, base_run: RunConfig) -> Shared:
    """Forecast each GPU's kernels once (one representative run per shard shape)."""
    by_gpu: dict[str, dict[tuple[Any, ...], RunConfig]] = {}
    for p in space.points:
        run = p.run(base_run)
        key = (run.tp, run.cp, run.ep, run.micro_batch_size, run.sequence_parallel)
        by_gpu.setdefault(space.contexts[p.context].inputs.gpu.name, {})[key] = run
    tables: dict[str, LatencyTable] = {}
    for ctx in space.contexts:
        name = ctx.inputs.gpu.name
        if name not in tables:
            tables[name] = latency_table(ctx.inputs, list(by_gpu.get(name, {}).values()))
    return Shared(
        contexts=space.contexts,
        tables=tuple(tables[c.inputs.gpu.name] for c in space.contexts),
        base_run=base_run,
        train_tokens=space.train_tokens,
    )


TOP_CANDIDATES = 48  # `tilesim sweep --candidates`
PER_CONTEXT = 2  # `tilesim sweep --per-context`


def candidate_points(
    points: Sequence[Point],
    rows: Sequence[Row],
    shared: Shared,
    *,
    top: int = TOP_CANDIDATES,
    per_context: int = PER_CONTEXT,
    by: str = "tokens",
) -> list[Point]:
    """The layouts among ``points`` that `select_candidates` picks from the screened ``rows``."""
    chosen = set(select_candidates(rows, top=top, per_context=per_context, by=by))
    keys = point_keys(points, shared.contexts)
    return [p for p, k in zip(points, keys, strict=True) if k in chosen]


def _screen_order(r: Row, by: str) -> float:
    """A screened row's place under the ranking ``by``, lowest first: tokens and time to
    train (one token budget for every layout) follow screen tokens/s; cost follows GPUs x
    price / screen tokens/s (GPU-hours per token x price; an unpriced row last)."""
    if by != "cost":
        return -r["screen_tokens_per_s"]
    price = r.get("price_per_gpu_hour")
    return math.inf if price is None else r["num_gpus"] * price / r["screen_tokens_per_s"]


def select_candidates(
    rows: Sequence[Row], *, top: int, per_context: int, by: str = "tokens"
) -> list[str]:
    """Keys to simulate: the ``top`` fitting layouts the screen rates best under the ranking
    ``by`` (fastest; cheapest for ``cost``: the fastest were all on the largest clusters, so a
    cost ranking's top rows missed cheaper layouts never simulated), plus the best
    ``per_context`` of every context (so scaling and procurement have a simulated best)."""
    ok = [r for r in rows if r["status"] == "ok"]
    ok.sort(key=lambda r: (_screen_order(r, by), r["key"]))
    keys = [r["key"] for r in ok[:top]]
    seen: dict[str, int] = {}
    for r in ok:
        if seen.get(r["context"], 0) < per_context:
            seen[r["context"]] = seen.get(r["context"], 0) + 1
            keys.append(r["key"])
    return sorted(set(keys))


def layout_row(shared: Shared, p: Point, tier: Tier) -> Row:
    """The layout columns of a row (no results yet)."""
    ctx = shared.contexts[p.context]
    inputs = ctx.inputs
    layout = {k: getattr(p, k) for k in p.__slots__ if k != "context"}
    return blank_row(
        key=p.key(ctx.id),
        option=ctx.option,
        context=ctx.id,
        gpu=inputs.gpu.name,
        server=ctx.server,
        network=ctx.network,
        num_gpus=inputs.num_gpus,
        tier=tier,
        price_per_gpu_hour=ctx.price_per_gpu_hour,
        power_w_per_gpu=ctx.power_w_per_gpu,
        train_tokens=shared.train_tokens,
        **layout,
    )


def _screen_row(row: Row, cache: ScreenCache, run: RunConfig) -> None:
    est = screen(cache, run)
    mem = est.memory
    row.update(
        screen_iteration_s=est.iteration_s,
        screen_tokens_per_s=est.tokens_per_s,
        memory_gib_per_gpu=mem.total_bytes / 2**30,
        fits=mem.fits,
        status="ok" if mem.fits else "infeasible",
        reason=mem.reason,
    )


def _simulate_row(row: Row, shared: Shared, p: Point, run: RunConfig) -> None:
    ctx = shared.contexts[p.context]
    inputs = ctx.inputs
    res = simulate(inputs, run, shared.tables[p.context]).to_row()
    exposed = res.pop("exposed_comm_s")
    res.pop("dp")
    row.update({k: v for k, v in res.items() if k in row})
    row.update({f"exposed_{k}_s": v for k, v in exposed.items()})
    row["status"] = "ok" if res["fits"] else "infeasible"
    tokens_per_step = inputs.global_batch_size * inputs.seq_len
    add_training_cost(row, tokens_per_step=tokens_per_step, checkpointing=ctx.checkpointing)


_SCREEN_CACHES: OrderedDict[tuple[str, int], ScreenCache] = OrderedDict()
SCREEN_CACHE_SLOTS = 32  # contexts whose screen caches one process keeps (least recent dropped)


def screen_cache(shared: Shared, context: int) -> ScreenCache:
    """This process's screen cache of one context of one sweep, kept across chunks: a Ray
    worker prices each block and collective once per sweep, not once per chunk (the rebuilds
    were about 40% of a 500-layout chunk). The values are the same either way."""
    key = (shared.token, context)
    cache = _SCREEN_CACHES.get(key)
    if cache is None:
        ctx = shared.contexts[context]
        cache = _SCREEN_CACHES[key] = ScreenCache(ctx.inputs, shared.tables[context])
        if len(_SCREEN_CACHES) > SCREEN_CACHE_SLOTS:
            _SCREEN_CACHES.popitem(last=False)
    else:
        _SCREEN_CACHES.move_to_end(key)
    return cache


def evaluate_chunk(tier: Tier, points: Sequence[Point], shared: Shared) -> list[Row]:
    """Rows for a chunk of layouts; unexpected errors are recorded per layout."""
    rows = []
    for p in points:
        row = layout_row(shared, p, tier)
        try:
            run = p.run(shared.base_run)
            if tier == "screen":
                _screen_row(row, screen_cache(shared, p.context), run)
            else:
                _simulate_row(row, shared, p, run)
        except InfeasibleConfig as e:
            row.update(status="infeasible", reason=e.reason)
        except Exception as e:
            # one line: a message of several split the report's Errors list item
            row.update(status="error", reason=" ".join(f"{type(e).__name__}: {e}".split()))
            row["error"] = traceback.format_exc()
        bad = finite_problem(row)
        if bad is not None:  # JSON has no NaN: this layout fails, the others go on
            row = layout_row(shared, p, tier)
            row.update(status="error", reason=f"non-finite result: {bad}")
        rows.append(row)
    return rows
