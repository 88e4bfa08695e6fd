"""The Markdown report's prose: what each column means, and its Notes section.

The Notes say how far the closed-form screen is from the simulation, why layouts did not fit,
what days, cost and energy are for, and that prices and power are the scenario's inputs.
Everything reads rows (`simulator.report` assembles the report).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from simulator.rows import Row


def screen_error(rows: Sequence[Row]) -> tuple[float, float] | None:
    """Median and max |screen / simulate - 1| of tokens/s over the simulated rows."""
    errs = sorted(
        abs(r["screen_tokens_per_s"] / r["tokens_per_s"] - 1)
        for r in rows
        if r["tier"] == "simulate" and r["tokens_per_s"] and r["screen_tokens_per_s"]
    )
    return (errs[len(errs) // 2], errs[-1]) if errs else None


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
        "(`sweep.train_tokens`), at each layout's simulated tokens/s: cost = GPUs x hours x "
        "price_per_gpu_hour; energy = GPUs x power_w_per_gpu x time, with the scenario's "
        "power per GPU as given (no facility overhead, PUE, is added)."
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
  (Narayanan et al. 2021, eq. 3); recomputation is not counted (it is in the rows' `hfu`).
* `step s`: the simulated time of one training step (forward, backward and optimizer), seconds.
* `bubble`: the mean over GPUs of the share of the forward-backward span a GPU's compute stream
  is idle: pipeline fill and drain, and waits on communication not hidden under compute (the
  gradient reduction left after the last backward, and the optimizer, are not in it).
* `GiB/GPU`: peak memory of the fullest GPU (weights, gradients, optimizer state, activations
  in flight, reserved), in GiB (2^30 bytes); a layout over the GPU's memory does not fit.
* `option`, `GPUs`: the cluster option (`[[sweep.options]]` by id, else the cluster's GPU)
  and its size.
* `days`, `cost $`, `MWh`: time, cost and energy to train the token budget `sweep.train_tokens`
  at the layout's tokens/s (`-` without the budget, a price or a power; see Notes).
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
        *([PRICE_NOTE] if priced else []),
    ]
