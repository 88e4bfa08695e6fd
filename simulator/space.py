"""The layouts a sweep visits: `[sweep]` lists -> cluster contexts x parallel layouts.

A scenario's ``[sweep]`` table holds lists; any `RunConfig` key not listed takes the ``[run]``
value. ``world_size`` lists cluster sizes (default ``cluster.num_gpus``). A procurement study
adds ``[[sweep.options]]`` tables (``id``, ``gpu``, ``server``, ``network``, optional
``num_gpus`` list, ``gpus_per_node``, and the user's ``price_per_gpu_hour`` and
``power_w_per_gpu``) and ``train_tokens = [N]`` (one value; the table holds lists). Swept
values are validated as strictly as ``[run]`` and ``[cluster]`` (an option's cluster keys by
`ClusterSection` itself); option ids (default: the GPU) must differ, and a repeated GPU count
is one cluster size. Prices, power and the token budget are finite numbers.

Each (option, world size) is a `Context` (resolved `SimInputs`); each layout is a `Point`, a
flat frozen record that travels to workers cheaply. Layouts that break a rule (tp does not
divide the heads, virtual stages without interleaving, ...) are pruned and counted by rule
(`Space.pruned_by`). A layout is kept in the form it runs as (`_canonical`: no sequence
parallelism at tp 1, plain 1F1B at pp 1, no ZeRO over one data-parallel rank), and one that
runs as an earlier one is pruned as a duplicate. Layouts that are valid but do not fit in
memory are kept and become ``infeasible`` rows.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.rows import RUN_KEYS
from simulator.scenario import ClusterSection, Scenario, SimInputs, resolve
from simulator.simulate import layout_of

OPTION_KEYS = {"id", "gpu", "server", "network", "num_gpus", "gpus_per_node"}
OPTION_KEYS |= {"nics_per_node", "price_per_gpu_hour", "power_w_per_gpu"}
SWEEP_KEYS = {*RUN_KEYS, "world_size", "options", "train_tokens"}
SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"


@dataclass(frozen=True, slots=True)
class Point:
    """One layout of one context; field order is the sort order of results."""

    context: int
    tp: int
    pp: int
    dp: int
    cp: int
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
        return (
            f"{context_id}/tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}-"
            f"mbs{self.micro_batch_size}-{self.schedule}-v{self.virtual_stages}-sp{sp}-"
            f"{self.recompute}-z{self.zero_stage}-do{do}"
        )


@dataclass(frozen=True)
class Context:
    """One cluster option at one size, resolved, with the user's price and power."""

    id: str
    option: str
    inputs: SimInputs
    server: str
    network: str
    price_per_gpu_hour: float | None
    power_w_per_gpu: float | None


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


def _values(scenario: Scenario, key: str) -> list[Any]:
    """The distinct values of one swept `RunConfig` key, each validated as ``[run]`` would be
    (strict: ``2.0``, ``"2"`` or ``true`` is not a size, ``"false"`` or ``1`` not a switch),
    as the validated values."""
    values = scenario.sweep.get(key, [getattr(scenario.run, key)])
    if not values:
        raise ConfigError(f"sweep.{key}: empty list")
    out = []
    for v in values:
        try:
            run = RunConfig.model_validate({key: v})
        except ValidationError as e:
            raise ConfigError(f"sweep.{key}: {v!r}: {e.errors()[0]['msg']}") from e
        out.append(getattr(run, key))
    return list(dict.fromkeys(out))


def _gpu_counts(values: Any, where: str) -> list[int]:
    """The distinct GPU counts of a non-empty list of positive whole numbers (a repeat is the
    same cluster: kept once), or a `ConfigError` naming ``where``."""
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}: give a non-empty list of GPU counts, e.g. [512, 1024]")
    for n in values:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ConfigError(f"{where}: {n!r} is not a positive whole number of GPUs")
    return list(dict.fromkeys(values))


def _number(value: Any, where: str, *, positive: bool = False) -> float:
    """A finite real number (> 0 when ``positive``, else >= 0), or a `ConfigError` naming
    ``where`` (NaN passes every comparison, so it is refused by name, as is infinity)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a finite positive number" if positive else "a finite number >= 0"
        raise ConfigError(f"{where}: {value!r}; give {need}")
    return float(value)


def _option_name(opt: dict[str, Any], i: int, base_gpu: str) -> str:
    """An option's id: its ``id`` (a non-empty string), else its GPU."""
    if "id" not in opt:
        return str(opt.get("gpu", base_gpu))
    if not isinstance(opt["id"], str) or not opt["id"].strip():
        raise ConfigError(f"sweep.options[{i}].id: {opt['id']!r}; give a non-empty string")
    return opt["id"]


def _options(scenario: Scenario) -> list[tuple[str, dict[str, Any]]]:
    """(id, table) of each ``[[sweep.options]]`` (one unnamed option without any); ids are
    unique, as rows of two options with one id would share keys and overwrite each other."""
    raw = scenario.sweep.get("options") or [{}]
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, opt in enumerate(raw):
        if not isinstance(opt, dict) or set(opt) - OPTION_KEYS:
            bad = sorted(set(opt) - OPTION_KEYS) if isinstance(opt, dict) else opt
            raise ConfigError(f"sweep.options[{i}]: unknown keys {bad}; use {sorted(OPTION_KEYS)}")
        for key in ("price_per_gpu_hour", "power_w_per_gpu"):
            if key in opt:
                _number(opt[key], f"sweep.options[{i}].{key}")
        if "num_gpus" in opt:  # validated once here, de-duplicated for `_contexts`
            opt = {**opt, "num_gpus": _gpu_counts(opt["num_gpus"], f"sweep.options[{i}].num_gpus")}
        name = _option_name(opt, i, scenario.cluster.gpu)
        if name in seen:
            how = "" if "id" in opt else " (named by its gpu: it has no id)"
            raise ConfigError(
                f"sweep.options[{i}]: duplicate option id {name!r}{how}, also used by "
                f'sweep.options[{seen[name]}]; give each option its own id = "..."'
            )
        seen[name] = i
        out.append((name, opt))
    return out


def _train_tokens(scenario: Scenario) -> float | None:
    tokens = scenario.sweep.get("train_tokens")
    if tokens is None:
        return None
    if not isinstance(tokens, list) or len(tokens) != 1:
        raise ConfigError(f"sweep.train_tokens: {tokens!r}; give one token budget, e.g. [2e12]")
    return _number(tokens[0], "sweep.train_tokens", positive=True)


CLUSTER_KEYS = ("gpu", "server", "network", "gpus_per_node", "nics_per_node")


def _section(base: ClusterSection, opt: dict[str, Any], i: int, n: int) -> ClusterSection:
    """``[cluster]`` with an option's keys and ``n`` GPUs, validated by the same rules as
    ``[cluster]`` (a copy with updates would skip them: gpus_per_node = 0 divided by zero)."""
    update = {k: opt[k] for k in CLUSTER_KEYS if k in opt}
    merged = {**base.model_dump(), **update, "num_gpus": n}
    if update.get("server", base.server) != base.server:
        # another server brings its own GPUs and NICs per node; [cluster]'s were for its own
        for k in ("gpus_per_node", "nics_per_node"):
            if k not in update:
                merged[k] = None
    try:
        return ClusterSection.model_validate(merged)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(x) for x in first["loc"])
        where = f"sweep.options[{i}].{key}" if key in update else f"cluster.{key}"
        raise ConfigError(f"{where}: {first['input']!r}: {first['msg']}") from e


def _contexts(scenario: Scenario) -> list[Context]:
    sizes = _gpu_counts(
        scenario.sweep.get("world_size", [scenario.cluster.num_gpus]), "sweep.world_size"
    )
    options = _options(scenario)
    named = "options" in scenario.sweep
    out: list[Context] = []
    for i, (name, opt) in enumerate(options):
        for n in opt.get("num_gpus", sizes):
            section = _section(scenario.cluster, opt, i, n)
            try:
                inputs = resolve(scenario.model_copy(update={"cluster": section}))
            except ConfigError as e:
                if not named or not str(e).startswith("cluster"):
                    raise  # the model's errors are not the option's
                raise ConfigError(f"sweep.options[{i}] ({name}, {n} GPUs): {e}") from e
            out.append(
                Context(
                    id=f"{name}@{n}",
                    option=name,
                    inputs=inputs,
                    server=section.server,
                    network=section.network or "",
                    price_per_gpu_hour=opt.get("price_per_gpu_hour"),
                    power_w_per_gpu=opt.get("power_w_per_gpu"),
                )
            )
    return out


def _canonical(p: dict[str, Any], num_gpus: int) -> dict[str, Any]:
    """The layout ``p`` runs as: sequence parallelism off at tp 1, plain 1F1B at pp 1 and for
    interleaving with one virtual stage, no ZeRO or distributed optimizer over one
    data-parallel rank, and dp 0 as the GPUs left over when tp*pp*cp divides them (``dp =
    [0, 2]`` listed one layout twice under one key). Layouts of one canonical form are one
    layout (the first is kept, under its canonical values, so a sweep listing only
    ``sequence_parallel = [true]`` still has its tp 1 layouts, as plain ones: they were pruned
    as duplicates of layouts not in the grid)."""
    q = dict(p)
    per_replica = q["tp"] * q["pp"] * q["cp"]
    if not q["dp"] and num_gpus % per_replica == 0:
        q["dp"] = num_gpus // per_replica
    if q["tp"] == 1:
        q["sequence_parallel"] = False
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


def _checked(scenario: Scenario) -> tuple[list[list[Any]], list[Context], float | None]:
    """The ``[sweep]`` table validated: the values of each run key, the cluster contexts and
    the token budget, or a `ConfigError` naming the first bad key."""
    unknown = set(scenario.sweep) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"sweep: unknown keys {sorted(unknown)}; use {sorted(SWEEP_KEYS)}")
    grid = [_values(scenario, k) for k in RUN_KEYS]
    return grid, _contexts(scenario), _train_tokens(scenario)


def check_sweep(scenario: Scenario) -> None:
    """Refuse a ``[sweep]`` table the sweep would refuse (`tilesim simulate` runs ``[run]``
    alone, and let a misspelt or mistyped sweep key pass until a sweep met it)."""
    _checked(scenario)


def enumerate_space(scenario: Scenario) -> Space:
    """Every valid, distinct layout of every context; invalid ones are only counted."""
    grid, contexts, train_tokens = _checked(scenario)
    points: list[Point] = []
    why: Counter[str] = Counter()
    example: dict[str, str] = {
        "duplicate": "the same layout as another once sequence parallelism at tp 1, a "
        "pipeline schedule at pp 1 or ZeRO over one data-parallel rank is dropped, dp 0 "
        "read as the GPUs left over",
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
