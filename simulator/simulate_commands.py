"""``tilesim simulate`` (one layout of a scenario) and ``tilesim validate distributed``.

Handlers parse, load, call `simulate` or `dist_validate`, and print.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import typing
from pathlib import Path

from forecast.files import write_atomic
from forecast.report import check_readme, duration_text, update_readme
from simulator.dist_validate import (
    LABEL_GPU,
    PUBLISHED,
    Check,
    check_labels,
    check_published,
    markdown,
)
from simulator.errors import (
    ConfigError,
    add_set_option,
    check_writable_above,
    path_arg,
    refuse_special_file,
)
from simulator.models import DEFAULT_DATA_DIR
from simulator.parallel import RunConfig
from simulator.results import OVER_100_REASON, StepResult
from simulator.scenario import SimInputs, TrainingSection, check_tokens, load_scenario, resolve
from simulator.simulate import latency_table, layout_of, simulate_timeline
from simulator.space import find_scenario
from simulator.sweep_table import check_sweep
from simulator.trace import write_trace


def add_simulate_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``simulate``."""
    p = sub.add_parser("simulate", help="predict one distributed training step of a scenario")
    p.add_argument(
        "scenario", type=path_arg, help="shipped id (scenarios/*.toml stem, _ as -) or TOML path"
    )
    add_set_option(p, "run.tp=8")
    p.add_argument(
        "--trace",
        type=path_arg,
        help="write the step's timeline here as Chrome trace JSON (one process per pipeline "
        "stage, times in us; open in ui.perfetto.dev or chrome://tracing)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (SI units: seconds, memory in GiB per GPU)",
    )
    p.set_defaults(handler=_simulate)


def add_validate_distributed(vs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``validate distributed`` under the ``validate`` subcommand."""
    d = vs.add_parser("distributed", help="distributed step vs A100 4-GPU labels, published runs")
    d.add_argument(
        "--latency-model",
        default="auto",
        choices=typing.get_args(TrainingSection.model_fields["latency_model"].annotation),
        help="kernel forecaster, as a scenario's training.latency_model (default: auto)",
    )
    d.add_argument("--labels-only", action="store_true", help="skip the published runs")
    d.add_argument("--readme", type=path_arg, default=None, help="rewrite the README's table")
    d.add_argument(
        "--data",
        type=path_arg,
        default=DEFAULT_DATA_DIR,
        help=f"NeuSight data folder (default: {DEFAULT_DATA_DIR})",
    )
    d.add_argument(
        "--published",
        type=path_arg,
        default=None,
        help=f"published runs, JSON (default: {PUBLISHED})",
    )
    d.set_defaults(handler=_validate_distributed)


DIST_BEGIN = "<!-- dist-validation:begin -->"
DIST_END = "<!-- dist-validation:end -->"


def _simulate(args: argparse.Namespace) -> int:
    scenario = load_scenario(find_scenario(str(args.scenario)), overrides=tuple(args.overrides))
    check_sweep(scenario)  # the file's [sweep], as `tilesim sweep` checks it
    inputs = resolve(scenario)
    layout_of(inputs, scenario.run)  # a layout the model cannot take: named before any work
    check_tokens(inputs.seq_len, scenario.run)
    if args.trace is not None:
        _check_trace_path(args.trace)
    result, timeline = simulate_timeline(
        inputs, scenario.run, latency_table(inputs, [scenario.run])
    )
    if args.trace is not None:
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.trace, lambda tmp: write_trace(timeline, tmp))  # whole or nothing
    if args.json:
        print(json.dumps(result.to_row()))
    else:
        print("\n".join(step_lines(inputs, scenario.run, result)))
    return 0 if result.fits else 1  # an infeasible layout: printed, and exit code 1


def step_lines(inputs: SimInputs, run: RunConfig, result: StepResult) -> list[str]:
    """What ``tilesim simulate`` prints: the layout simulated, then the step, its speed, the
    pipeline bubble, the exposed communication and the memory, each with its unit."""
    comm = ", ".join(f"{k} {duration_text(v)}" for k, v in result.exposed_comm_s.items() if v > 0)
    hbm = f"{inputs.gpu.hbm_bytes / 2**30:.1f} GiB of GPU memory"
    fits = f"fits in its {hbm}" if result.fits else f"does NOT fit in its {hbm}: {result.reason}"
    chunks = f" x {run.virtual_stages} chunks" if run.virtual_stages > 1 else ""
    return [
        f"{inputs.name} on {inputs.num_gpus:,} x {inputs.gpu.id}, "
        f"{inputs.dtype.value}; tp {run.tp}, pp {run.pp}{chunks}, dp {result.dp}"
        + (f", cp {run.cp}" if run.cp > 1 else "")
        + (f", ep {run.ep}" if run.ep > 1 else "")
        + f"; {result.num_micro_batches} micro-batch"
        + ("es" if result.num_micro_batches != 1 else "")
        + f" of {run.micro_batch_size} x "
        f"{inputs.seq_len:,} tokens per replica, {run.schedule} schedule",
        f"  step      {duration_text(result.iteration_s)} (forward+backward "
        f"{duration_text(result.forward_backward_s)}, optimizer "
        f"{duration_text(result.optimizer_s)})",
        f"  speed     {result.tokens_per_s:,.0f} tokens/s; {result.model_tflops_per_gpu:.1f} "
        f"model / {result.hardware_tflops_per_gpu:.1f} hardware TFLOP/s per GPU",
        f"  of peak   MFU {result.mfu:.1%}, causal MFU {result.mfu_causal:.1%}; with "
        f"recomputation HFU {result.hfu:.1%}, causal HFU {result.hfu_causal:.1%}",
        *(
            textwrap.wrap(
                f"(over 100%: MFU, HFU and hardware TFLOP/s: {OVER_100_REASON})",
                width=90,
                initial_indent=" " * 12,
                subsequent_indent=" " * 12,
            )
            if max(result.mfu, result.hfu) > 1.0 and result.mfu_causal < result.mfu
            else []
        ),
        f"  pipeline  bubble {result.bubble_fraction:.1%} of forward+backward",
        f"  exposed communication (on the critical path): {comm or 'none'}",
        f"  memory    {result.memory_gib_per_gpu:.1f} GiB per GPU, {fits}",
    ]


def _check_trace_path(path: Path) -> None:
    """``--trace`` names a file this run can write: not a folder, in a folder that exists or
    that it can create (as the figures' paths are: `figures.save`)."""
    if path.is_dir() or not path.name:
        raise ConfigError(f"--trace {path} is a folder; give a file name such as step.json")
    refuse_special_file(path, "--trace")
    check_writable_above(path.parent, f"--trace {path}")


ZERO3_FIT_MODEL = "174.6B"  # the GPT-3 175B rows


def validation_text(checks: list[Check]) -> str:
    """The table and summaries `tilesim validate distributed` prints (and writes into the
    README between its markers)."""
    text = markdown(checks)
    pub = [c for c in checks if c.metric != "fw+bw s"]
    if pub:
        text += "\n\n" + _summary("published runs", pub) + "\n"
        text += _summary("without DeepSpeed ZeRO-3 rows", [c for c in pub if "zero3" not in c.name])
        zero3 = [c for c in pub if "zero3" in c.name]
        fit = [c for c in zero3 if ZERO3_FIT_MODEL in c.name]
        if fit:  # `dp_comm.DEEPSPEED_2021_ZERO3_EFFICIENCY` was fitted on these rows only
            text += "\n" + _summary("ZeRO-3 rows its efficiency was fitted on", fit)
            rest = [c for c in zero3 if c not in fit]
            text += "\n" + _summary("ZeRO-3 rows outside that fit", rest)
    return text


def _validate_distributed(args: argparse.Namespace) -> int:
    if args.readme is not None and args.labels_only:
        raise ConfigError("--readme needs the published runs too; drop --labels-only")
    if args.published is not None and args.labels_only:  # it was read as nothing
        raise ConfigError("--published: --labels-only skips the published runs; drop one")
    args.published = PUBLISHED if args.published is None else args.published
    if args.readme is not None:  # before the work, not after it
        check_readme(args.readme, [(DIST_BEGIN, DIST_END)])
    labels = args.data / LABEL_GPU
    if not labels.is_dir():
        raise ConfigError(f"--data {args.data}: no {LABEL_GPU}; give the NeuSight data folder")
    if not args.labels_only and not args.published.is_file():
        raise ConfigError(f"--published {args.published}: no such file; give dev_runs.json")
    checks = check_labels(latency_model=args.latency_model, data_dir=args.data)
    if not args.labels_only:
        checks += check_published(latency_model=args.latency_model, path=args.published)
    text = validation_text(checks)
    if args.readme is not None:
        update_readme(args.readme, text, begin=DIST_BEGIN, end=DIST_END)
    print(text)
    return 0


def _summary(title: str, checks: list[Check]) -> str:
    errs = sorted(abs(c.error) for c in checks)
    if not errs:
        return ""
    mid = len(errs) // 2
    median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
    return f"{title}: median |error| {median:.1%}, max {errs[-1]:.1%} ({len(errs)} runs)"
