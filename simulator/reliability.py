"""Expected wall time of a training run that fails and restarts from its last checkpoint.

A synchronous data-, tensor- and pipeline-parallel job stops when any of its GPUs, their
servers, NICs or switches fails, and resumes from its last checkpoint. With interruptions
arriving at random (a Poisson process) at the cluster's rate, ``num_gpus / gpu_mtbf``, a run
of ``W`` seconds of failure-free work, checkpointed every ``tau`` seconds of work at ``delta``
seconds each, with ``R`` seconds from an interruption to training again, takes in expectation

    T = M e^(R/M) (e^((tau + delta)/M) - 1) W / tau,         M = gpu_mtbf / num_gpus

(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22, 2006: each segment of work and its checkpoint reruns
until it completes without an interruption; an interruption during a restart restarts it).
``tau`` defaults to the interval that minimises ``T`` (`optimal_interval_s`; Young's
``sqrt(2 delta M)`` to first order). Goodput is ``W / T``: the share of the wall time (and
of the GPU-hours paid for) that trains.

Not modelled: stragglers and slow nodes, silent data corruption, time lost to planned
maintenance, spare nodes swapped in without a full restart, and asynchronous checkpoints
(a user with them gives the blocking part as ``checkpoint_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import ConfigError

BISECTIONS = 200  # halvings of the optimum's bracket: float64 runs out first (same bits each run)


@dataclass(frozen=True)
class Checkpointing:
    """A cluster's interruptions and its run's checkpoints, in seconds."""

    mtbf_s: float  # mean time between interruptions of the whole job (gpu_mtbf / num_gpus)
    checkpoint_s: float  # training paused to write one checkpoint
    restart_s: float  # from an interruption to training again from the last checkpoint
    interval_s: float | None = None  # work between checkpoints; None: `optimal_interval_s`


@dataclass(frozen=True)
class RunWithFailures:
    """The expected cost of failures to one run."""

    wall_s: float  # expected wall time: work, checkpoints, lost work and restarts
    interval_s: float  # work between checkpoints
    goodput: float  # work / wall


def optimal_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The work between checkpoints that minimises Daly's expected wall time: the root of
    ``e^((tau + delta)/M) (tau/M - 1) + 1 = 0`` (the derivative's sign), which increases
    with ``tau`` from ``1 - e^(delta/M) < 0`` at 0 to 1 at ``M``, found by bisection. A
    checkpoint that costs nothing is taken continuously (0)."""
    if checkpoint_s == 0.0:
        return 0.0
    d = checkpoint_s / mtbf_s
    lo, hi = 0.0, 1.0  # in units of the MTBF
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        # e^(x+d)(x-1)+1 < 0  <=>  (1-x) e^(x+d) > 1; in logs, so a large d cannot overflow
        if math.log1p(-mid) + mid + d > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi) * mtbf_s


def run_with_failures(work_s: float, c: Checkpointing) -> RunWithFailures:
    """Daly's expected wall time of ``work_s`` seconds of failure-free training under ``c``
    (the module's formula). The interval is at most the run (a run shorter than the optimum
    writes one checkpoint, at its end). A `ConfigError` when the expectation overflows: the
    cluster is interrupted so often against its checkpoints and restarts that the run, in
    expectation, never completes."""
    tau = optimal_interval_s(c.checkpoint_s, c.mtbf_s) if c.interval_s is None else c.interval_s
    tau = min(tau, work_s)
    m = c.mtbf_s
    try:
        if tau == 0.0:  # the limit tau -> 0 with delta = 0: a restart per interruption
            wall = math.exp(c.restart_s / m) * work_s
        else:
            wall = m * math.exp(c.restart_s / m) * math.expm1((tau + c.checkpoint_s) / m)
            wall *= work_s / tau
    except OverflowError:
        wall = math.inf
    if not math.isfinite(wall):
        raise ConfigError(
            f"reliability: an interruption every {m:,.0f} s on average against a "
            f"{c.checkpoint_s:,.0f} s checkpoint and a {c.restart_s:,.0f} s restart: the run "
            "never completes in expectation; raise gpu_mtbf_hours or shorten the checkpoint"
        )
    return RunWithFailures(wall_s=wall, interval_s=tau, goodput=work_s / wall)
