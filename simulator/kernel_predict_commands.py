"""``tilesim kernels predict`` (one kernel from flags) and ``kernels eval`` (score CSVs).

Handlers parse the kernel or the measurement files, load a latency model of `forecast`, call
``predict_s`` or `forecast.evaluate.score`, and print.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from forecast.dataset import DataError, load_measurements
from forecast.evaluate import NO_ROWS, score
from forecast.gpus import GPUError, load_gpu
from forecast.kernels import FAMILY_OPS, GEMM_FAMILIES, Dtype, KernelSpec, OpFamily, resolve_op
from forecast.predict import LATENCY_MODELS, ModelError, load_latency_model
from forecast.report import ReportError, eval_lines, kernel_header, kernel_lines
from forecast.tensor_core import TensorCoreError
from simulator.collect_commands import gemm_kernel, parse_dims
from simulator.errors import ConfigError, path_arg

KERNEL_ERRORS: tuple[type[Exception], ...] = (DataError, ModelError, TensorCoreError, ReportError)
MODEL_HELP = (
    "auto (default: tile-mlp for fp32, the tensor-core model for tf32/fp16/bf16/fp8 matmuls "
    "and attention, a bandwidth model for their other kernels), tile-mlp (fp32 only), "
    "roofline or tensor-core"
)


def _op_help() -> str:
    """Every --op name, by family (the list the error for an unknown op prints)."""
    ops = {f: ", ".join(names) for f, names in FAMILY_OPS.items()}
    return (
        f"gemm; {ops[OpFamily.BMM]}; {ops[OpFamily.LINEAR]}; {ops[OpFamily.ATTENTION]}; "
        f"softmax; layernorm (ln); element-wise: {ops[OpFamily.ELEMENTWISE]}; "
        f"memory: {ops[OpFamily.MEMORY]}; a family name means its first op"
    )


def add_predict_command(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels predict``."""
    q = ks.add_parser("predict", help="latency of one kernel on one GPU")
    q.add_argument("--gpu", required=True, help="catalog id, device name, .toml or NeuSight .json")
    q.add_argument("--op", required=True, help=_op_help())
    q.add_argument(
        "--dims",
        required=True,
        help="M,N,K for gemm (K the reduction); B,M,N,K for bmm/linear (N the reduction); "
        "BH,S_q,S_kv,D for attention (flash attention 2: attention, attention_bwd non-causal; "
        "attention_causal, attention_causal_bwd causal, the mask aligned bottom right); "
        "B,H (rows, row width) for element-wise, softmax, layernorm and memory ops; "
        "sizes in elements",
    )
    q.add_argument(
        "--dtype",
        default="fp32",
        help="fp32 (default), tf32, fp16, bf16 or fp8; the GPU must have a catalog peak for it "
        "(fp8: Ada, Hopper, Blackwell, MI300 only)",
    )
    q.add_argument("--model", default="auto", help=MODEL_HELP)
    q.add_argument(
        "--json", action="store_true", help="print one JSON object: latency_s, tflops (TFLOP/s)"
    )
    q.set_defaults(handler=_predict)


def add_eval_command(ks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kernels eval``."""
    e = ks.add_parser("eval", help="score measurement CSVs (NeuSight schema), per family")
    e.add_argument("--csv", nargs="+", required=True, type=path_arg, help=".csv or .csv.gz files")
    e.add_argument(
        "--model",
        default="tile-mlp",
        help=f"one of {', '.join(LATENCY_MODELS)} (default: tile-mlp, as the README's table)",
    )
    e.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: per family n, mape_pct, median_ape_pct, p90_ape_pct; skipped",
    )
    e.set_defaults(handler=_eval)


# what --dims holds per op: (count, form); no op pads a missing size with 1
DIMS_FORM = {
    "gemm": (3, "M,N,K (K the reduction)"),
    "gemm-family": (4, "B,M,N,K (N the reduction; --op gemm takes M,N,K)"),
    "attention": (4, "BH,S_q,S_kv,D"),
    "vector": (2, "B,H"),
}


def _check_count(text: str, count: int, op: str, form: tuple[int, str]) -> None:
    """Refuse ``--dims`` of the wrong length for ``op``, naming the form it takes."""
    if count != form[0]:
        raise ConfigError(
            f"--dims {text!r}: --op {op} takes {form[0]} sizes {form[1]}, got {count}"
        )


def _kernel(args: argparse.Namespace) -> KernelSpec:
    if args.dtype not in {d.value for d in Dtype}:
        accepted = ", ".join(d.value for d in Dtype)
        raise ConfigError(f"--dtype {args.dtype!r}: use one of {accepted}")
    if args.op == "gemm":  # M,N,K with K the reduction -> bmm (1, M, K, N)
        _check_count(args.dims, len(args.dims.split(",")), "gemm", DIMS_FORM["gemm"])
        return gemm_kernel(args.dims, args.dtype)
    try:
        family, op = resolve_op(args.op)
    except ValueError as e:
        raise ConfigError(f"--op: {e}") from e
    dtype = Dtype(args.dtype)
    dims = parse_dims(args.dims)
    form = (
        DIMS_FORM["gemm-family"]
        if family in GEMM_FAMILIES
        else DIMS_FORM["attention"]
        if family is OpFamily.ATTENTION
        else DIMS_FORM["vector"]
    )
    _check_count(args.dims, len(dims), args.op, form)
    try:
        return KernelSpec(family, dims, dtype, op)
    except ValueError as e:
        raise ConfigError(f"--dims/--op: {e}") from e


def latency_model_arg(kind: str) -> Any:
    """The latency model ``--model kind`` names; an unknown name is a `ConfigError`."""
    try:
        return load_latency_model(kind)
    except ValueError as e:
        if isinstance(e, KERNEL_ERRORS):
            raise
        raise ConfigError(f"--model: {e}") from e


def _predict(args: argparse.Namespace) -> int:
    kernel = _kernel(args)
    gpu = load_gpu(args.gpu)
    model = latency_model_arg(args.model)
    try:
        latency_s = float(model.predict_s([kernel], gpu)[0])
    except (GPUError, TensorCoreError) as e:  # "dtype fp8: ..." names the flag the user set
        if str(e).startswith(("dtype ", "op ")):
            raise ConfigError(f"--{e}") from e
        raise
    # its operands and result, each held once: more than the GPU's memory cannot run as one
    # kernel; the forecast is printed and the exit code is 1, as for a model that does not fit
    fits = kernel.bytes() <= gpu.hbm_bytes
    too_big = (
        f"its operands and result take {kernel.bytes() / 2**30:,.1f} GiB, more than the "
        f"GPU's {gpu.hbm_bytes / 2**30:.1f} GiB: it cannot run as one kernel"
    )
    if args.json:
        print(json.dumps({"latency_s": latency_s, "tflops": kernel.flops() / latency_s / 1e12}))
        if not fits:
            print(f"tilesim: does not fit: {too_big}", file=sys.stderr)
        return 0 if fits else 1
    print(
        kernel_header(
            kernel, gpu, gemm_dims=args.dims.replace(" ", "") if args.op == "gemm" else None
        )
    )
    print("\n".join(f"  {line}" for line in kernel_lines(kernel, gpu, model, latency_s)))
    if not fits:
        print(f"  memory   does NOT fit: {too_big}")
    return 0 if fits else 1


EVAL_FAMILIES = ("bmm", "linear", "elementwise", "softmax", "layernorm")


def _eval(args: argparse.Namespace) -> int:
    meas = load_measurements(args.csv)
    scored = score(latency_model_arg(args.model), meas)
    # the five NeuSight families always (n 0 and nulls when the CSVs hold none of a family, so
    # a script reads the same keys whatever it passed), then any other family scored
    result = {f: scored.get(f, NO_ROWS) for f in EVAL_FAMILIES} | scored
    if all(s["n"] == 0 for fam, s in result.items() if fam != "skipped"):
        skipped = result["skipped"]
        first = (
            f"; {skipped[0]['file']} line {skipped[0]['line']}: {skipped[0]['reason']}"
            if skipped
            else ""
        )
        raise ConfigError(
            f"--csv: no row to score ({len(skipped)} skipped{first}); give measurements in "
            "the NeuSight schema"
        )
    if args.json:
        print(json.dumps(result))
        return 0
    print("\n".join(eval_lines(args.model, meas, result)))
    return 0
