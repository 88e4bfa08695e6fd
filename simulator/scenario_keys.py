"""Every key a scenario file accepts, with its type, default and meaning, from the pydantic
models that validate it: `tilesim list keys` prints it and docs/scenario_keys.md is that output
(`tests/simulator/test_scenario_keys.py` keeps the two equal)."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel

from simulator.cluster_section import ClusterSection
from simulator.model_section import ModelSection
from simulator.parallel import RunConfig
from simulator.reliability_section import ReliabilitySection
from simulator.rows import RUN_KEYS
from simulator.scenario import StudySection, TrainingSection

SECTIONS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("study", StudySection),
    ("model", ModelSection),
    ("cluster", ClusterSection),
    ("training", TrainingSection),
    ("run", RunConfig),
    ("reliability", ReliabilitySection),
)
SWEEP_TEXT = f"""\
Lists under `[sweep]`: the `[run]` keys {", ".join(f"`{k}`" for k in RUN_KEYS)} (every
combination is a layout; a key not listed, and every other `[run]` key, takes its `[run]`
value), plus `world_size` (cluster sizes; default `cluster.num_gpus`). A procurement
study adds `train_tokens = [N]`, the token budget: a run takes whole optimizer steps, steps =
ceil(N / tokens per step) with tokens per step = training.global_batch_size x
model.seq_len, and time to train = steps x the layout's step time (with a `[reliability]`
table, the expected wall time of those steps with interruptions, checkpoints and restarts).
It also adds `[[sweep.options]]` tables, one per cluster option: `id`, `gpu`, `server`,
`network`, optional `num_gpus` (a list), `gpus_per_node`, `nics_per_node`, and the user's
`price_per_gpu_hour` (US$ per GPU-hour, all-in: cost = GPUs x hours x price),
`power_w_per_gpu` (watts per GPU while training, as the user counts it: the board alone, or
its server's draw over its GPUs with CPUs and NICs; energy = GPUs x power x time, no PUE
added) and `gpu_mtbf_hours` (the option's own, replacing `[reliability]`'s); prices, powers
and MTBFs are positive, prices and powers at most 1e6, the budget at least one optimizer
step's tokens and at most 1e18, an `id` one line without `|`. `--set TABLE.KEY=VALUE` on
`tilesim simulate` and `tilesim sweep` overrides any key (`--set run.tp=8`)."""


def type_text(annotation: Any) -> str:
    """A field's type as a reader wants it: ``1f1b | gpipe``, ``int (optional)``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " \\| ".join(type_text(a) for a in args)
        return f"{inner} (optional)" if len(args) < len(typing.get_args(annotation)) else inner
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default_text(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "-"
    return f'"{value}"' if isinstance(value, str) else str(value)


def keys_markdown() -> str:
    """The reference as Markdown: one table per section, then the sweep's keys."""
    lines = [
        "# Scenario keys",
        "",
        "Every key of a scenario TOML file (`tilesim simulate`, `tilesim sweep`), printed by",
        "`tilesim list keys` from the models that validate the file. A misspelt or unknown key is",
        "an error that names it.",
    ]
    for name, model in SECTIONS:
        doc = " ".join((model.__doc__ or "").split("\n\n")[0].split())
        lines += ["", f"## [{name}]", "", doc, "", "| key | type | default | meaning |"]
        lines.append("|---|---|---|---|")
        for key, field in model.model_fields.items():
            default = "required" if field.is_required() else _default_text(field.default)
            meaning = " ".join((field.description or "").split())
            lines.append(f"| `{key}` | {type_text(field.annotation)} | {default} | {meaning} |")
    lines += ["", "## [sweep]", "", SWEEP_TEXT]
    return "\n".join(lines) + "\n"
