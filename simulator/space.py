"""The layouts a sweep visits: `[sweep]` lists -> cluster contexts x parallel layouts.

The ``[sweep]`` table is validated, and its cluster options resolved into `Context` objects, by
`simulator.sweep_table`; here each layout of each context is a `Point`, a flat frozen record
that travels to workers cheaply. Layouts that break a rule (tp does not divide the heads,
virtual stages without interleaving, ...) are pruned and counted by rule (`Space.pruned_by`).
A layout is kept in the form it runs as (`_canonical`: no sequence parallelism at tp 1, plain
1F1B at pp 1, no ZeRO over one data-parallel rank), and one that runs as an earlier one is
pruned as a duplicate. Layouts that are valid but do not fit in memory are kept and become
``infeasible`` rows. Scenario ids name the shipped files (`find_scenario`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.rows import RUN_KEYS
from simulator.scenario import Scenario, SimInputs
from simulator.simulate import layout_of
from simulator.sweep_table import Context, checked_sweep

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"


@dataclass(frozen=True, slots=True)
class Point:
    """One layout of one context; field order is the sort order of results."""

    context: int
    tp: int
    pp: int
    dp: int
    cp: int
    cp_comm_type: str
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    sequence_parallel: bool
    recompute: str
    zero_stage: int
    distributed_optimizer: bool

    def __reduce__(self) -> tuple[type[Point], tuple[int | str | bool, ...]]:
        """Pickle as the field tuple: Ray ships chunks of hundreds of points, and a slotted
        dataclass's default state pickles and loads about 3x slower."""
        return (
            Point,
            (
                self.context,
                self.tp,
                self.pp,
                self.dp,
                self.cp,
                self.cp_comm_type,
                self.micro_batch_size,
                self.schedule,
                self.virtual_stages,
                self.sequence_parallel,
                self.recompute,
                self.zero_stage,
                self.distributed_optimizer,
            ),
        )

    def run(self, base: RunConfig) -> RunConfig:
        """The `RunConfig`: ``base`` with this point's keys (values validated when swept)."""
        return base.model_copy(update={k: getattr(self, k) for k in RUN_KEYS})

    def key(self, context_id: str) -> str:
        """A stable, readable id of the layout, unique within a sweep."""
        sp, do = int(self.sequence_parallel), int(self.distributed_optimizer)
        cp = f"{self.cp}" + ("" if self.cp_comm_type == "p2p" else f"-{self.cp_comm_type}")
        return (
            f"{context_id}/tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{cp}-"
            f"mbs{self.micro_batch_size}-{self.schedule}-v{self.virtual_stages}-sp{sp}-"
            f"{self.recompute}-z{self.zero_stage}-do{do}"
        )


def point_keys(points: Sequence[Point], contexts: Sequence[Context]) -> list[str]:
    """`Point.key` of each layout, with its context's id."""
    return [p.key(contexts[p.context].id) for p in points]


@dataclass(frozen=True)
class Space:
    """Every layout to evaluate, the contexts they refer to and what was pruned."""

    contexts: tuple[Context, ...]
    points: tuple[Point, ...]
    train_tokens: float | None
    # (rule, layouts pruned by it, the first one's reason), most first: "duplicate", "sizes"
    # (`_cheap_ok`), else the key a `ConfigError` names ("run.virtual_stages")
    pruned_by: tuple[tuple[str, int, str], ...] = ()

    @property
    def pruned(self) -> int:
        """Layouts pruned before screening, all rules together."""
        return sum(n for _, n, _ in self.pruned_by)

    def pruned_text(self) -> str:
        """The pruned layouts by rule, one clause each, for a message or the report."""
        return "; ".join(f"{n} by {rule} ({why})" for rule, n, why in self.pruned_by)


def shipped_scenarios() -> list[str]:
    """Ids of the shipped scenarios (file stems with ``_`` as ``-``), sorted."""
    return sorted(p.stem.replace("_", "-") for p in SCENARIO_DIR.glob("*.toml"))


def find_scenario(name: str | Path) -> Path:
    """A scenario path, or the shipped file whose stem (``_`` as ``-``) equals ``name``."""
    path = Path(name)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise ConfigError(f"scenario {path}: no such file")
        return path
    for candidate in sorted(SCENARIO_DIR.glob("*.toml")):
        if name in (candidate.stem, candidate.stem.replace("_", "-")):
            return candidate
    known = ", ".join(shipped_scenarios())
    raise ConfigError(f"scenario {name!r}: not a file nor a shipped id ({known})")


def _canonical(p: dict[str, Any], num_gpus: int) -> dict[str, Any]:
    """The layout ``p`` runs as: sequence parallelism off at tp 1, CP's p2p ring at cp 1 (no
    CP type moves anything there), plain 1F1B at pp 1 and for interleaving with one virtual
    stage, no ZeRO or distributed optimizer over one data-parallel rank, and dp 0 as the GPUs
    left over when tp*pp*cp divides them (``dp = [0, 2]`` listed one layout twice under one
    key). Layouts of one canonical form are one layout (the first is kept, under its canonical
    values, so a sweep listing only ``sequence_parallel = [true]`` still has its tp 1 layouts,
    as plain ones: they were pruned as duplicates of layouts not in the grid)."""
    q = dict(p)
    per_replica = q["tp"] * q["pp"] * q["cp"]
    if not q["dp"] and num_gpus % per_replica == 0:
        q["dp"] = num_gpus // per_replica
    if q["tp"] == 1:
        q["sequence_parallel"] = False
    if q["cp"] == 1:
        q["cp_comm_type"] = "p2p"
    if q["pp"] == 1:
        q["schedule"], q["virtual_stages"] = "1f1b", 1
    if q["schedule"] == "1f1b-interleaved" and q["virtual_stages"] == 1:
        q["schedule"] = "1f1b"
    if q["dp"] * q["cp"] == 1:
        q["zero_stage"], q["distributed_optimizer"] = 0, False
    return q


def _cheap_ok(p: dict[str, Any], inputs: SimInputs) -> bool:
    """Integer rules checked before building a layout (fast rejection of most of a grid)."""
    per_replica = p["tp"] * p["pp"] * p["cp"]
    if inputs.num_gpus % per_replica:
        return False
    dp = p["dp"] or inputs.num_gpus // per_replica
    return dp * per_replica == inputs.num_gpus and not (
        inputs.global_batch_size % (dp * p["micro_batch_size"])
    )


def enumerate_space(scenario: Scenario) -> Space:
    """Every valid, distinct layout of every context; invalid ones are only counted."""
    grid, contexts, train_tokens = checked_sweep(scenario)
    points: list[Point] = []
    why: Counter[str] = Counter()
    example: dict[str, str] = {
        "duplicate": "the same layout as another once sequence parallelism at tp 1, a CP "
        "communication type at cp 1, a pipeline schedule at pp 1 or ZeRO over one "
        "data-parallel rank is dropped, dp 0 read as the GPUs left over",
        "sizes": "tp*pp*cp does not divide the GPUs, a listed dp does not take all of them, "
        "or the global batch is not a multiple of dp x micro-batch",
    }
    for ci, ctx in enumerate(contexts):
        seen: set[tuple[Any, ...]] = set()
        for combo in itertools.product(*grid):
            p = _canonical(dict(zip(RUN_KEYS, combo, strict=True)), ctx.inputs.num_gpus)
            if tuple(p.values()) in seen:
                why["duplicate"] += 1
                continue
            seen.add(tuple(p.values()))
            if not _cheap_ok(p, ctx.inputs):
                why["sizes"] += 1
                continue
            try:
                layout = layout_of(ctx.inputs, scenario.run.model_copy(update=p))
            except ConfigError as e:
                rule, _, reason = str(e).partition(": ")
                why[rule] += 1
                example.setdefault(rule, reason)
                continue
            points.append(Point(context=ci, **(p | {"dp": layout.dp})))
    return Space(
        contexts=tuple(contexts),
        points=tuple(sorted(points, key=_sort_key)),
        train_tokens=train_tokens,
        pruned_by=tuple(
            (rule, n, example[rule])
            for rule, n in sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))
        ),
    )


def _sort_key(p: Point) -> tuple[Any, ...]:
    return tuple(getattr(p, f.name) for f in fields(p))
