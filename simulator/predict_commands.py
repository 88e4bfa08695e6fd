"""``tilesim predict``: one whole-model run, a JSONL of runs, or a traced ``--module``.

Handlers parse, load, call `e2e.predict_run` (or `module_predict.predict_module`), and print.
The ``--runs`` file is read by `simulator.runs_file`; ``tilesim validate``, which this module
registers after ``predict``, is `simulator.validate_commands`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from forecast.files import find_relative
from forecast.gpus import GPUError, load_gpu
from forecast.predict import LatencyModel
from simulator.e2e import E2EResult, predict_run
from simulator.errors import ConfigError, path_arg, pydantic_msg
from simulator.latency import DeratedRoofline, latency_model_for
from simulator.models import DEFAULT_DATA_DIR, MAX_SEQ, list_models, load_model
from simulator.opgraph import MAX_TOKENS, Workload
from simulator.runs_file import model_of, parse_run_line, read_run_lines
from simulator.validate_commands import add_validate_commands


def add_predict_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``predict``, then ``validate e2e|distributed``."""
    _add_predict(sub)
    add_validate_commands(sub)


def _add_predict(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``predict``."""
    p = sub.add_parser("predict", help="whole-model inference or training-step time on one GPU")
    p.add_argument("--model", help="catalog id, NeuSight model name, .toml or HF config .json")
    p.add_argument("--gpu", help="catalog id, device name, .toml or NeuSight device .json")
    p.add_argument("--batch", type=int, help="sequences per pass (required without --runs)")
    p.add_argument("--seq", type=int, help="tokens per sequence (required without --runs)")
    p.add_argument(
        "--mode",
        choices=["inf", "train"],
        help="inference pass or training step (required without --runs)",
    )
    p.add_argument(
        "--framework",
        help="hf-eager (default) | hf-compile (torch.compile inference: GPT-2, BERT, OPT, Llama) | "
        "megatron; not with --module",
    )
    p.add_argument(
        "--dtype", help="fp32 (default), tf32, bf16, fp16, fp8; not with --module (its parameters')"
    )
    p.add_argument(
        "--runs",
        type=path_arg,
        help=f"JSONL, one run per line: a JSON object of keys {', '.join(RUN_KEYS)} (as the "
        "flags; --latency-model and --data apply to every run; a relative model or GPU file "
        "path is read from the runs file's folder, else from the current folder)",
    )
    p.add_argument("--module", help="FILE.py:FUNC, FUNC(batch, seq) -> (nn.Module, inputs): traced")
    p.add_argument(
        "--latency-model",
        default="auto",
        help="auto (default: tile-mlp for fp32, tensor-core model otherwise) | tile-mlp | "
        "roofline | roofline-derated (the roofline at sustained rates, as in scenarios)",
    )
    p.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    p.add_argument("--json", action="store_true", help="print JSON (one object per run)")
    p.set_defaults(handler=_predict)


RUN_KEYS = ("model", "gpu", "batch", "seq", "mode", "framework", "dtype")

DATA_HELP = (
    f"NeuSight data folder whose models/NAME.json a NeuSight model name reads (default: "
    f"{DEFAULT_DATA_DIR}); GPUs come from the catalog or a --gpu file"
)


def reads_data(model: object) -> bool:
    """Whether ``--model`` names a NeuSight model, the one thing read from ``--data`` (its
    models/NAME.json): no file suffix, not a catalog id."""
    return isinstance(model, str) and Path(model).suffix == "" and model not in list_models()


def check_data_read(data: Path | None, model: object, why: str = "") -> None:
    """Refuse a ``--data`` that nothing would read (``why``: the reason no model reads it, for
    ``--module`` or ``--runs``): a GPU, even a NeuSight device name, comes from the catalog, so
    a folder of the user's device sheets, or one that does not exist, was ignored unsaid."""
    if data is None or reads_data(model):
        return
    why = why or f"--model {model} is not one"
    raise ConfigError(
        f"--data {data}: only a NeuSight model name is read from it (DATA/models/NAME.json) "
        f"and {why}; a GPU comes from the catalog or a --gpu .toml/.json file: leave out --data"
    )


# how to fix a missing or bad flag of one run (--runs lines name the JSON key instead)
FLAG_FIX = {
    "model": "a catalog id (tilesim list models), NeuSight model name, .toml or HF .json",
    "gpu": "a catalog id (tilesim list gpus), device name, .toml or NeuSight device .json",
    "batch": "sequences per pass, a whole number > 0",
    "seq": "tokens per sequence, a whole number > 0",
    "mode": "inf or train",
}


def _workload(fields: dict[str, Any], *, flags: bool = False) -> Workload:
    """The run's `Workload`; a bad value names its flag (``flags``) or its JSON key."""
    _check_sizes(fields, flags=flags)
    try:
        return Workload.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        msg = pydantic_msg(first)
        if not first["loc"]:
            raise ConfigError(msg) from e
        key = str(first["loc"][0])
        if first["type"] == "greater_than":  # batch or seq 0 or below
            msg = f"must be a whole number > 0, got {first['input']!r}"
        raise ConfigError(f"--{key}: {msg}" if flags else f"field {key!r}: {msg}") from e


def _check_sizes(fields: dict[str, Any], *, flags: bool) -> None:
    """A sequence past `MAX_SEQ` tokens (the causal attention's cost, a list per row block,
    outgrew memory) or a pass past `MAX_TOKENS`, named as the user gave them (`Workload`
    said ``batch x (past + seq)``, and past is no flag of predict's)."""
    batch, seq = fields.get("batch"), fields.get("seq")
    if type(batch) is not int or type(seq) is not int or batch < 1 or seq < 1:
        return  # missing or not a whole number > 0: `Workload` names it
    if seq > MAX_SEQ:
        key = "--seq" if flags else "field 'seq'"
        raise ConfigError(
            f"{key}: {seq:,} tokens a sequence; at most {MAX_SEQ:,} (2^27) are modelled, "
            "give a shorter one"
        )
    if batch * seq > MAX_TOKENS:
        sizes = f"--batch {batch} x --seq {seq}" if flags else f"'batch' {batch} x 'seq' {seq}"
        raise ConfigError(
            f"{sizes} = {batch * seq:.3g} tokens a pass; at most {MAX_TOKENS:.3g} (2^40) are "
            f"modelled: use a smaller {'--batch' if flags else 'batch'}"
        )


WHOLE_MODEL_LATENCY = ("auto", "tile-mlp", "roofline")
# and simulator/latency.py's roofline at sustained rates, as scenarios take it
PREDICT_LATENCY = (*WHOLE_MODEL_LATENCY, DeratedRoofline.name)


def latency_model(kind: str) -> LatencyModel:
    """A latency model that covers every kernel of a model (`tensor-core` alone covers GEMMs
    and attention: it is for `kernels predict`, and `auto` uses it for those)."""
    if kind not in PREDICT_LATENCY:
        why = (
            "forecasts GEMMs and attention only, not a whole model's element-wise kernels"
            if kind == "tensor-core"
            else "is not a latency model"
        )
        raise ConfigError(
            f"--latency-model {kind}: {why}; use {', '.join(PREDICT_LATENCY)} "
            "(auto runs the tensor-core model where it applies)"
        )
    return latency_model_for(kind)


def _predict_module(args: argparse.Namespace) -> int:
    """``--module FILE.py:FUNC``: trace on the meta device, then forecast like a model."""
    from simulator.module_predict import predict_module

    if args.model is not None or args.runs is not None:
        raise ConfigError("--module and --model/--runs are mutually exclusive")
    if args.dtype is not None or args.framework is not None:
        raise ConfigError(
            "--module takes its dtype from the module's parameters (cast them in FUNC) and "
            "prices the ops it traces as they are: leave out --dtype and --framework"
        )
    missing = [f"--{k}" for k in ("gpu", "batch", "seq", "mode") if getattr(args, k) is None]
    if missing:
        raise ConfigError(f"--module needs {', '.join(missing)}")
    check_data_read(args.data, None, "--module traces its own model")
    run = _workload({"batch": args.batch, "seq": args.seq, "mode": args.mode}, flags=True)
    gpu = load_gpu(str(args.gpu))
    res, unmapped = predict_module(args.module, gpu, run, latency_model(args.latency_model))
    if args.json:
        print(json.dumps({**res.model_dump(), "unmapped_ops": unmapped}))
    else:
        _print_result(res, run.mode, gpu.hbm_bytes / 2**30)
        listed = ", ".join(f"{k} x{n}" for k, n in unmapped.items()) or "none"
        print(f"unmapped aten ops (priced as copies): {listed}")
    return 0 if res.fits else 1


def _run_one(
    spec: dict[str, Any],
    args: argparse.Namespace,
    latency: LatencyModel | None = None,
    *,
    flags: bool = False,
) -> E2EResult:
    """One run from its keys: the flags' values (``flags``: errors name the flag) or a
    ``--runs`` line's (errors name the JSON key)."""
    unknown = set(spec) - set(RUN_KEYS)
    missing = [k for k in RUN_KEYS[:5] if spec.get(k) is None]
    if flags and missing:
        raise ConfigError("; ".join(f"--{k}: required ({FLAG_FIX[k]})" for k in missing))
    if flags:
        check_data_read(args.data, str(spec["model"]))
    if unknown or missing:
        bad = f"unknown keys {sorted(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise ConfigError(f"run {bad}; keys: {', '.join(RUN_KEYS)}")
    run = _workload({k: spec[k] for k in RUN_KEYS[2:] if spec.get(k) is not None}, flags=flags)
    model = load_model(str(spec["model"]), data_dir=args.data)
    gpu = load_gpu(str(spec["gpu"]))
    try:  # the run's dtype first: megatron's fp8 runs attention in bf16, which it did not ask
        gpu.peak_for(run.dtype)
        return predict_run(model, gpu, run, latency or latency_model(args.latency_model))
    except GPUError as e:  # "dtype fp8: ...": name the flag the user set
        if flags and str(e).startswith("dtype "):
            raise GPUError(f"--{e}") from None
        raise


def result_text(res: E2EResult, mode: str, hbm_gib: float) -> str:
    """What ``tilesim predict`` prints for one run: an inference pass is its forward alone (no
    backward, no optimizer to print as 0.00); a training step's e2e is forward + backward, its
    optimizer step reported beside it, as the labels count them; memory against the GPU's."""
    if mode == "inf":
        times = f"e2e {res.e2e_ms:.2f} ms (inference: one forward pass)"
    else:
        times = (
            f"e2e {res.e2e_ms:.2f} ms (training step: forward {res.fw_ms:.2f} + backward "
            f"{res.bw_ms:.2f}); optimizer step {res.optimizer_ms:.2f} ms more"
        )
    verdict = "fits" if res.fits else "does NOT fit"
    return f"{times}\nmemory {res.memory_gib:.2f} GiB: {verdict} in the GPU's {hbm_gib:.1f} GiB"


def _print_result(res: E2EResult, mode: str, hbm_gib: float, *, as_json: bool = False) -> None:
    print(json.dumps(res.model_dump()) if as_json else result_text(res, mode, hbm_gib))


def _predict(args: argparse.Namespace) -> int:
    if args.module is not None:
        return _predict_module(args)
    if args.runs is None:
        spec = {k: getattr(args, k) for k in RUN_KEYS}
        res = _run_one(spec, args, flags=True)
        hbm_gib = load_gpu(str(spec["gpu"])).hbm_bytes / 2**30
        _print_result(res, str(spec["mode"]), hbm_gib, as_json=args.json)
        return 0 if res.fits else 1  # as `tilesim simulate`: the forecast, then the verdict
    return _predict_runs(args)


def _predict_runs(args: argparse.Namespace) -> int:
    """``--runs FILE.jsonl``: one JSON line out per run line, with its line number; a bad line
    is its error line, the others still run, and the exit code is 1 with the failed lines named
    on stderr (as a sweep with failed layouts), so a script sees the failure without parsing
    every line. A run that does not fit in its GPU's memory prints its forecast and is named
    on stderr too, with exit code 1, as one run of ``predict`` exits."""
    flags = [f"--{k}" for k in RUN_KEYS if getattr(args, k) is not None]
    if flags:  # they were ignored: every run comes from its line
        raise ConfigError(
            f"--runs takes each run's keys from its line; leave out {', '.join(flags)} "
            "(or put them in every line)"
        )
    raw = read_run_lines(args.runs)
    if not any(reads_data(model_of(line)) for line in raw):
        check_data_read(args.data, None, "no line of --runs names one")
    latency = latency_model(args.latency_model)  # a bad --latency-model: once, exit 2
    failed: list[int] = []
    unfit: list[int] = []
    for i, line in enumerate(raw, 1):
        if not line.strip():
            continue
        out = {"line": i, **_run_line(line, args, latency)}  # blank lines keep the count
        if "error" in out:
            failed.append(i)
        elif not out["fits"]:
            unfit.append(i)
        print(json.dumps(out))
    runs = sum(1 for line in raw if line.strip())
    for lines, what in ((failed, "failed"), (unfit, "do not fit in GPU memory")):
        if lines:
            named = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
            print(f"tilesim: {len(lines)} of {runs} runs {what}: line {named}", file=sys.stderr)
    return 1 if failed or unfit else 0


def _run_line(line: bytes, args: argparse.Namespace, latency: LatencyModel) -> dict[str, Any]:
    """One ``--runs`` line's result, or ``{"error": ...}`` naming what is wrong with it (a bad
    line never stops the others)."""
    try:
        spec = parse_run_line(line)
        for key in ("model", "gpu"):  # a file path: from the runs file's folder, as scenarios
            value = spec.get(key)
            if isinstance(value, str) and Path(value).suffix in (".toml", ".json"):
                spec[key] = find_relative(value, args.runs.parent) or value
        return _run_one(spec, args, latency).model_dump()
    except UnicodeDecodeError:
        return {"error": "not UTF-8 text; write each run as UTF-8 JSON"}
    except json.JSONDecodeError as e:
        return {"error": f"not a JSON object: {e}"}
    except (ConfigError, GPUError, ValueError) as e:
        return {"error": str(e).splitlines()[0]}
    except Exception as e:  # name what broke
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
