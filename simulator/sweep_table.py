"""The ``[sweep]`` table validated: swept run-key values, cluster options as contexts, tokens.

A scenario's ``[sweep]`` table holds lists; any `RunConfig` key not listed takes the ``[run]``
value. ``world_size`` lists cluster sizes (default ``cluster.num_gpus``). A procurement study
adds ``[[sweep.options]]`` tables (``id``, ``gpu``, ``server``, ``network``, optional
``num_gpus`` list, ``gpus_per_node``, and the user's ``price_per_gpu_hour`` and
``power_w_per_gpu``) and ``train_tokens = [N]`` (one value; the table holds lists). Swept
values are validated as strictly as ``[run]`` and ``[cluster]`` (an option's cluster keys by
`ClusterSection` itself); option ids (default: the GPU) must differ, and a repeated GPU count
is one cluster size. Prices, power and the token budget are finite positive numbers up to
`LIMITS`; the budget is at least one optimizer step's tokens.

Each (option, world size) is a `Context` (resolved `SimInputs`); `simulator.space` crosses the
contexts with the run-key values into layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from simulator.cluster_section import MAX_GPUS, ClusterSection
from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.reliability import Checkpointing
from simulator.reliability_section import MAX_HOURS, checkpointing
from simulator.rows import RUN_KEYS
from simulator.scenario import Scenario, SimInputs, resolve

OPTION_KEYS = {"id", "gpu", "server", "network", "num_gpus", "gpus_per_node"}
OPTION_KEYS |= {"nics_per_node", "price_per_gpu_hour", "power_w_per_gpu", "gpu_mtbf_hours"}
SWEEP_KEYS = {*RUN_KEYS, "world_size", "options", "train_tokens"}


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
    checkpointing: Checkpointing | None = None  # with a [reliability] table


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
        if n > MAX_GPUS:
            raise ConfigError(f"{where}: {n:,} GPUs; at most {MAX_GPUS:,} are modelled")
    return list(dict.fromkeys(values))


# The largest inputs taken: far above any real quote, power draw or training run (Llama 3 took
# 15e12 tokens), and small enough that GPUs x hours x price stays finite (a 1e308 price made
# every simulated layout's cost infinite, an error row, after the whole sweep had run).
LIMITS = {
    "price_per_gpu_hour": (1e6, "US$ per GPU-hour", "; or leave it out: no cost for the option"),
    "power_w_per_gpu": (1e6, "W per GPU", "; or leave it out: no energy for the option"),
    "train_tokens": (1e18, "tokens", ", e.g. [2e12]"),
    "gpu_mtbf_hours": (MAX_HOURS, "hours", "; or leave it out: [reliability]'s applies"),
}


def _number(value: Any, where: str, key: str) -> float:
    """A finite number > 0 and at most ``LIMITS[key]``, or a `ConfigError` naming ``where``
    (NaN passes every comparison, so it is refused by name, as is infinity; zero is refused:
    a price of 0 tied every layout of its option at $0, ranked by key, not by speed)."""
    most, unit, fix = LIMITS[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= most:
        raise ConfigError(
            f"{where}: {value!r}; give a finite positive number, at most {most:g} {unit}{fix}"
        )
    return float(value)


def _option_name(opt: dict[str, Any], i: int, base_gpu: str) -> str:
    """An option's id: its ``id`` (a non-empty line without ``|``), else its GPU."""
    if "id" not in opt:
        return str(opt.get("gpu", base_gpu))
    name = opt["id"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"sweep.options[{i}].id: {name!r}; give a non-empty string")
    if "|" in name or not name.isprintable():  # a row of the report's tables split in two
        raise ConfigError(
            f"sweep.options[{i}].id: {name!r}; give one line without '|' (it would split the "
            'report\'s tables), e.g. "h100-rent"'
        )
    return name


def _options(scenario: Scenario) -> list[tuple[str, dict[str, Any]]]:
    """(id, table) of each ``[[sweep.options]]`` (one unnamed option without any); ids are
    unique, as rows of two options with one id would share keys and overwrite each other."""
    raw = scenario.sweep.get("options") or [{}]
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, opt in enumerate(raw):
        if not isinstance(opt, dict):  # it was "unknown keys 1"
            raise ConfigError(
                f"sweep.options[{i}]: {opt!r} is not a table; write each option as "
                "[[sweep.options]] with keys " + ", ".join(sorted(OPTION_KEYS))
            )
        if set(opt) - OPTION_KEYS:
            bad = sorted(set(opt) - OPTION_KEYS)
            raise ConfigError(f"sweep.options[{i}]: unknown keys {bad}; use {sorted(OPTION_KEYS)}")
        for key in ("price_per_gpu_hour", "power_w_per_gpu", "gpu_mtbf_hours"):
            if key in opt:
                _number(opt[key], f"sweep.options[{i}].{key}", key)
        if "gpu_mtbf_hours" in opt and scenario.reliability is None:  # it would be ignored
            raise ConfigError(
                f"sweep.options[{i}].gpu_mtbf_hours: no [reliability] table; add one with "
                "gpu_mtbf_hours, restart_s and checkpoint_s (`tilesim list keys`)"
            )
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
    """The token budget: one number, at least one optimizer step's tokens (a budget of 1 token
    "trained" in 1e-11 days, under one step, which no run can take)."""
    tokens = scenario.sweep.get("train_tokens")
    if tokens is None:
        return None
    if not isinstance(tokens, list) or len(tokens) != 1:
        raise ConfigError(f"sweep.train_tokens: {tokens!r}; give one token budget, e.g. [2e12]")
    budget = _number(tokens[0], "sweep.train_tokens", "train_tokens")
    batch, seq = scenario.training.global_batch_size, scenario.model.seq_len
    if budget < batch * seq:
        raise ConfigError(
            f"sweep.train_tokens: {tokens[0]!r} is under one optimizer step (training."
            f"global_batch_size {batch} x model.seq_len {seq} = {batch * seq:,} tokens); give "
            "the whole run's tokens, e.g. [2e12]"
        )
    return budget


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
            ckpt = None
            if scenario.reliability is not None:
                ckpt = checkpointing(
                    scenario.reliability,
                    num_gpus=n,
                    model=inputs.model,
                    dtype=inputs.dtype,
                    gpu_mtbf_hours=opt.get("gpu_mtbf_hours"),
                    where=f"sweep.options[{i}] ({name})"
                    if "gpu_mtbf_hours" in opt
                    else "reliability",
                )
            out.append(
                Context(
                    id=f"{name}@{n}",
                    option=name,
                    inputs=inputs,
                    server=section.server,
                    network=section.network or "",
                    price_per_gpu_hour=opt.get("price_per_gpu_hour"),
                    power_w_per_gpu=opt.get("power_w_per_gpu"),
                    checkpointing=ckpt,
                )
            )
    return out


def checked_sweep(scenario: Scenario) -> tuple[list[list[Any]], list[Context], float | None]:
    """The ``[sweep]`` table validated: the values of each run key, the cluster contexts and
    the token budget, or a `ConfigError` naming the first bad key."""
    unknown = set(scenario.sweep) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"sweep: unknown keys {sorted(unknown)}; use {sorted(SWEEP_KEYS)}")
    grid = [_values(scenario, k) for k in RUN_KEYS]
    tokens = _train_tokens(scenario)
    if scenario.reliability is not None and tokens is None:  # it would change nothing
        raise ConfigError(
            "reliability: interruptions price the time to train a token budget, and the "
            "scenario has none; add sweep.train_tokens = [N] (e.g. [2e12]) or remove [reliability]"
        )
    return grid, _contexts(scenario), tokens


def check_sweep(scenario: Scenario) -> None:
    """Refuse a ``[sweep]`` table the sweep would refuse (`tilesim simulate` runs ``[run]``
    alone, and let a misspelt or mistyped sweep key pass until a sweep met it)."""
    checked_sweep(scenario)
