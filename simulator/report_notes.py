"""The Markdown report's prose: what each column means, and its Notes section.

The Notes say how far the closed-form screen is from the simulation, why layouts did not fit,
what days, cost and energy are for, and that prices and power are the scenario's inputs.
Everything reads rows (`simulator.report` assembles the report).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from simulator.rows import Row


def amount_text(v: float | None) -> str:
    """Days, dollars, MWh or a step's seconds: whole numbers from 100 up, else three
    significant digits (fixed decimals printed a fine-tuning job's 0.37 $ as "0", its 0.19 MWh
    as "0", 0.002 days as "0.0"; a step's ".3g" printed 19.0 s as "19" beside "19.1"); from
    10^9 in powers of ten (a 0.5-hour GPU MTBF printed 10^226 days as 227 digits)."""
    if v is None:
        return "-"
    return format(v, ".3g" if abs(v) >= 1e9 else ",.0f" if abs(v) >= 100 else "#.3g")


def screen_error(rows: Sequence[Row]) -> tuple[float, float] | None:
    """Median and max |screen / simulate - 1| of tokens/s over the simulated rows (the
    median of an even count is the mean of the middle two: the upper one, taken before, read
    2.3% where the procurement-70b sweep's median is 2.2%)."""
    errs = sorted(
        abs(r["screen_tokens_per_s"] / r["tokens_per_s"] - 1)
        for r in rows
        if r["tier"] == "simulate" and r["tokens_per_s"] and r["screen_tokens_per_s"]
    )
    return (statistics.median(errs), errs[-1]) if errs else None


def _reasons(rows: Sequence[Row]) -> str:
    """The layouts that do not fit, by the pipeline stage over the GPU's memory: the note
    read "515 x stage 0", which did not say that stage 0 is where the memory ran out."""
    c = Counter(
        (r["reason"] or "").split(" needs ")[0] for r in rows if r["status"] == "infeasible"
    )
    if not c:
        return "* Every screened layout fits in GPU memory."
    where = ", ".join(f"{n} at {why or 'an unnamed stage'}" for why, n in c.most_common(5))
    return (
        f"* Do not fit in GPU memory: {c.total()} layouts, by the pipeline stage that needs "
        f"more than the GPU holds (rows' `reason`): {where}."
    )


def _basis(rows: Sequence[Row]) -> list[str]:
    """What days, $ and MWh are for (the tables did not say): the token budget, the forms."""
    tokens = next((r["train_tokens"] for r in rows if r.get("train_tokens")), None)
    if tokens is None:  # the tables' days and cost $ were all "-", and "see Notes" said nothing
        return [
            "* Days, cost $ and MWh are `-`: the scenario sets no token budget "
            "(`sweep.train_tokens`), so there is no time, cost or energy to train."
        ]
    return [
        f"* Days, cost and energy are for the token budget, {tokens:g} tokens "
        "(`sweep.train_tokens`), in whole optimizer steps: time = ceil(budget / (global batch "
        "x sequence length)) x the layout's simulated step time; cost = GPUs x hours x "
        "price_per_gpu_hour; energy = GPUs x power_w_per_gpu x time, with the scenario's "
        "power per GPU as given (no facility overhead, PUE, is added).",
        *_reliability_note(rows),
    ]


def _reliability_note(rows: Sequence[Row]) -> list[str]:
    """How interruptions enter the time (said only with a ``[reliability]`` table)."""
    good = [r["goodput"] for r in rows if r.get("goodput") is not None]
    if not good:
        return []
    return [
        "* With the scenario's `[reliability]` table, time (and so cost and energy) is the "
        "expected wall time of those steps on a cluster interrupted at random every "
        "gpu_mtbf_hours / GPUs on average, resuming from its last checkpoint (J. T. Daly "
        "2006): checkpoint writes, work lost since the last checkpoint and restarts included, "
        "checkpoints at the interval that minimises it unless the scenario sets one. "
        f"`goodput` = failure-free time / that time: {min(good):.1%} to {max(good):.1%} here. "
        "Failure rates, checkpoint and restart times are the scenario's inputs."
    ]


# said only when the scenario gives a price or a power (every report said it)
PRICE_NOTE = (
    "* Prices and power are the scenario's inputs (see the scenario file), not catalog facts."
)

# What each column of the report's tables is (the report printed them unexplained), and the
# top-layouts figure's parts; the definitions are those of `simulator.results`
COLUMNS = """\
* `context`: the cluster option and its GPU count, `option@GPUs`.
* `layout`, `best layout`: tensor (`tp`), context (`cp`, shown when over 1), pipeline (`pp`) and
  data (`dp`) parallel degrees, micro-batch size (`mbs`), pipeline schedule (`/vN`: N virtual
  stages per GPU), activation recomputation (none, selective, full), ZeRO stage (`z`), then
  `sp` (sequence parallelism) and `dist-opt` (distributed optimizer) when on.
* `tokens/s`: the whole cluster's training throughput, global batch x sequence length / step
  time.
* `MFU`: model FLOPs per step / (GPUs x step time x the GPU's dense peak FLOP/s in the training
  dtype). Model FLOPs are 3 forward passes (the backward counted as two), a forward pass per
  token being 2 x the layer weights (QKV, projection, FFN) + 4 x sequence length x attention
  width per layer (causal mask not discounted) + 2 x hidden size x vocabulary for the head
  (Narayanan et al. 2021, eq. 3); recomputation is not counted (it is in the rows' `hfu`,
  and with causal pairs in `hfu_causal`).
  This is the published runs' convention, but a causal decoder attends only S (S + 1) / 2 of
  the S x S (query, key) pairs, so at long sequences it overstates the GPU's work and can pass
  100%.
* `causal MFU`: MFU with the attention scores and values counted over those unmasked pairs
  only, 2 x (sequence length + 1) x attention width per token and layer (rows' `mfu_causal`);
  equal to MFU for a model that attends both ways (BERT); `-` in rows an older tilesim wrote.
* `step s`: the simulated time of one training step (forward, backward and optimizer), seconds.
* `bubble`: the mean over GPUs of the share of the forward-backward span a GPU's compute stream
  is idle: pipeline fill and drain, and waits on communication not hidden under compute (the
  gradient reduction left after the last backward, and the optimizer, are not in it).
* `GiB/GPU`: peak memory of the fullest GPU (weights, gradients, optimizer state, activations
  in flight, reserved), in GiB (2^30 bytes); a layout over the GPU's memory does not fit.
* `option`, `GPUs`: the cluster option (`[[sweep.options]]` by id, else the cluster's GPU)
  and its size.
* `days`, `cost $`, `MWh`: time, cost and energy to train the token budget `sweep.train_tokens`
  in whole steps of the layout's step time (`-` without the budget, a price or a power; see
  Notes), with interruptions and checkpoints when the scenario has a `[reliability]` table.
* `goodput` (with a `[reliability]` table): the share of that time spent training.
* Top-layouts figure: each step's critical path split into compute, exposed communication by
  kind (time on the critical path spent in tp, cp, ep, pp or dp communication that compute did
  not hide) and the optimizer; the parts add up to the step."""


def notes(rows: Sequence[Row]) -> list[str]:
    """The Notes section's items: the screen's error against the simulation, the reasons
    layouts do not fit, the basis of days, cost and energy, and (only when the scenario gives
    a price or a power) where those come from."""
    err = screen_error(rows)
    priced = any(r.get("price_per_gpu_hour") or r.get("power_w_per_gpu") for r in rows)
    return [
        f"* Screen vs simulation, tokens/s: median |error| {err[0]:.1%}, max {err[1]:.1%}."
        if err
        else "* No simulated rows to check the screen against.",
        _reasons(rows),
        *_basis(rows),
        *cost_time_note(rows),
        *([PRICE_NOTE] if priced else []),
    ]


def _listed(items: Sequence[str], word: str) -> str:
    """ "a", "a or b", "a, b or c"."""
    return f"{', '.join(items[:-1])} {word} {items[-1]}" if len(items) > 1 else items[0]


def cost_time_front(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """The best layout of each option and size with a time and a cost, fastest first, split
    in two: those no other's is both at least as fast to train and at least as cheap (better in
    one), and the rest. Within one option and size cost is GPUs x price x time, so its fastest
    layout is also its cheapest, and the front of every layout is the front of each one's best."""
    best: dict[str, Row] = {}
    for r in sorted(rows, key=lambda r: (r["time_to_train_s"] or 0.0, r["key"])):
        priced = r["time_to_train_s"] is not None and r["cost_usd"] is not None
        if r["tier"] == "simulate" and r["status"] == "ok" and priced:
            best.setdefault(r["context"], r)

    def beaten(a: Row) -> bool:
        return any(
            b["time_to_train_s"] <= a["time_to_train_s"]
            and b["cost_usd"] <= a["cost_usd"]
            and (b["time_to_train_s"], b["cost_usd"]) != (a["time_to_train_s"], a["cost_usd"])
            for b in best.values()
        )

    return [r for r in best.values() if not beaten(r)], [r for r in best.values() if beaten(r)]


def cost_time_note(rows: Sequence[Row]) -> list[str]:
    """Which options trade time for cost and which are beaten on both (the report ranked
    them one way, by speed or cost, and left the trade-off to the reader); none without two
    priced options."""
    front, beaten = cost_time_front(rows)
    if len(front) + len(beaten) < 2:
        return []
    on = [
        f"{r['context']} ({amount_text(r['time_to_train_s'] / 86400)} days, "
        f"{amount_text(r['cost_usd'])} $)"
        for r in front
    ]
    rest = ""
    if beaten:
        names = _listed([r["context"] for r in beaten], "and")
        rest = f"; {names} {'are each' if len(beaten) > 1 else 'is'} no faster and no cheaper "
        rest += "than one of those"
    return [
        "* Time vs cost, each option and size at its best layout: no other is both faster and "
        f"cheaper than {_listed(on, 'or')} (the Pareto front){rest}."
    ]
