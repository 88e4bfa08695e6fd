"""``tilesim serve``: prefill and decode of a batch of generation requests on one GPU,
or sharded over `--tp` GPUs of one server (`serve_parallel`)."""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from forecast.gpus import GPUError, GPUSpec, load_gpu
from forecast.predict import LatencyModel
from simulator.errors import ConfigError, path_arg
from simulator.figures import figure_path
from simulator.models import ModelSpec, load_model
from simulator.predict_commands import DATA_HELP, PREDICT_LATENCY, check_data_read, latency_model
from simulator.serve import (
    PassTimes,
    ServeRequest,
    ServeResult,
    forecast_passes,
    serve_forecast,
    summarise,
)
from topologies import Cluster
from topologies.catalog import load_cluster, load_server

FIX = {
    "batch": "sequences served together, a whole number > 0",
    "prompt": "tokens per prompt, a whole number > 0",
    "gen": "tokens generated per sequence, a whole number > 0",
    "framework": "megatron (fused kernels, flash attention; default) or hf-eager",
    "dtype": "bf16 (default), fp16, fp8, tf32 or fp32",
    "tp": "GPUs of one server sharing each layer (tensor parallelism), a whole number > 0",
}


def add_serve_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``."""
    p = sub.add_parser(
        "serve",
        help="generation on one GPU or --tp GPUs of a server: prefill, per-token decode with a KV "
        "cache, throughput",
    )
    p.add_argument("--model", required=True, help="catalog id, NeuSight model name, .toml or .json")
    p.add_argument(
        "--gpu", help="catalog id, device name, .toml or device .json (default: --server's)"
    )
    p.add_argument(
        "--server",
        help="server id or .toml (tilesim list servers) whose GPUs --tp shares a layer over",
    )
    p.add_argument("--tp", type=int, default=1, help=f"{FIX['tp']} (default: 1)")
    p.add_argument("--batch", type=int, required=True, help=FIX["batch"])
    p.add_argument("--prompt", type=int, required=True, help=FIX["prompt"])
    p.add_argument("--gen", type=int, required=True, help=FIX["gen"])
    p.add_argument("--framework", default="megatron", help=FIX["framework"])
    p.add_argument("--dtype", default="bf16", help=FIX["dtype"])
    p.add_argument(
        "--latency-model",
        default="auto",
        help=f"{' | '.join(PREDICT_LATENCY)} (default auto: the tensor-core model for 16/8-bit "
        "kernels, tile-mlp for fp32)",
    )
    p.add_argument("--data", type=path_arg, default=None, help=DATA_HELP)
    p.add_argument(
        "--plot",
        type=path_arg,
        default=None,
        help="draw time per token against throughput over batch sizes, and pass time against "
        "context (PNG, PDF, SVG ...)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_serve)


def _request(args: argparse.Namespace) -> ServeRequest:
    fields = {k: getattr(args, k) for k in ("batch", "prompt", "gen", "framework", "dtype", "tp")}
    try:
        return ServeRequest.model_validate(fields)
    except ValidationError as e:
        key = str(e.errors()[0]["loc"][0])
        raise ConfigError(f"--{key} {fields[key]}: use {FIX[key]}") from None


def _serve(args: argparse.Namespace) -> int:
    req = _request(args)
    latency = latency_model(args.latency_model)
    if args.plot is not None:
        figure_path(args.plot, "--plot")  # before any work
    check_data_read(args.data, args.model)
    model = load_model(str(args.model), data_dir=args.data)
    gpu, cluster = _hardware(args, req)
    curve = _forecast(model, gpu, req, latency, cluster)
    res = summarise(curve, gpu)
    if args.json:
        print(json.dumps(res.model_dump()))
    else:
        _print(res, req)
    if args.plot is not None:
        from simulator.serve_plots import plot_serve  # matplotlib only when a figure is drawn

        title = serve_title(model.id, gpu.id, req)

        def at(batch: int) -> ServeResult:
            other = req.model_copy(update={"batch": batch})
            return serve_forecast(model, gpu, other, latency, cluster=cluster)

        path = plot_serve(req, title, curve, at, res.max_batch, args.plot)
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0 if res.fits else 1  # as `tilesim simulate`: the forecast, then the verdict


def _forecast(
    model: ModelSpec,
    gpu: GPUSpec,
    req: ServeRequest,
    latency: LatencyModel,
    cluster: Cluster | None,
) -> PassTimes:
    """`forecast_passes`, its errors naming the flag the user set: ``dtype fp8: ...`` (the
    GPU has no such rate) and ``model: ...`` (no KV cache for it) name ``--dtype``/``--model``."""
    try:  # the request's dtype first: megatron's fp8 runs attention in bf16, not asked for
        gpu.peak_for(req.dtype)
        return forecast_passes(model, gpu, req, latency, cluster=cluster)
    except (GPUError, ConfigError) as e:
        if str(e).startswith(("dtype ", "model: ")):
            raise type(e)(f"--{e}") from None
        raise


def serve_title(model_id: str, gpu_id: str, req: ServeRequest) -> str:
    """The figure's title: ``1 x GPU`` at tp 1 read as a count, "1 tokens" as a typo."""
    gpus = gpu_id if req.tp == 1 else f"{req.tp} x {gpu_id}"
    tokens = "1 token" if req.gen == 1 else f"{req.gen} tokens"
    return (
        f"{model_id} on {gpus}, {req.framework} {req.dtype}: "
        f"{req.prompt}-token prompts, {tokens} generated (forecast)"
    )


def _hardware(args: argparse.Namespace, req: ServeRequest) -> tuple[GPUSpec, Cluster | None]:
    """The GPU, and with ``--server`` the cluster of one such server."""
    if args.server is None:
        if args.gpu is None:
            raise ConfigError("--gpu: required (a catalog id, tilesim list gpus), or --server")
        if req.tp > 1:
            raise ConfigError(f"--tp {req.tp}: give --server, the server the GPUs sit in")
        return load_gpu(str(args.gpu)), None
    spec = load_server(str(args.server))
    try:
        gpu = load_gpu(spec.gpu)
    except GPUError as e:  # a server file's own GPU: name the file and its field
        raise ConfigError(
            f"--server {args.server}: field 'gpu': {str(e).split(':')[0]}; "
            "give a catalog GPU id (tilesim list gpus)"
        ) from None
    if args.gpu is not None and load_gpu(str(args.gpu)).id != gpu.id:
        raise ConfigError(
            f"--gpu {args.gpu}: server {spec.id} holds {spec.gpu}; leave out --gpu or give "
            f"--gpu {spec.gpu}"
        )
    return gpu, load_cluster(str(args.server), gpus=req.tp)


def serve_text(res: ServeResult, req: ServeRequest) -> str:
    """The lines ``tilesim serve`` prints: no decode line at ``--gen 1`` (the prefill makes the
    one token), no communication line at ``--tp 1`` (there is none)."""
    rate = res.output_tokens_per_s  # 0.26 tokens/s is not "0", nor 0.0033 "0.00"
    tokens_s = f"{rate:,.0f}" if rate >= 100 else f"{rate:.2f}" if rate >= 0.01 else f"{rate:.2g}"
    passes = req.gen - 1
    lines = [
        f"batch {req.batch}, prompt {req.prompt}, gen {req.gen} ({req.framework}, {req.dtype}, "
        f"tp {req.tp})",
        f"  {'prefill (time to first token)':30}{res.prefill_ms:10.2f} ms",
    ]
    if passes == 0:
        lines.append("  no decode: the one generated token comes from the prefill")
    else:
        label = f"decode, {passes} pass{'' if passes == 1 else 'es'}"
        lines.append(
            f"  {label:30}{res.decode_ms:10.2f} ms ({res.first_decode_ms:.2f} -> "
            f"{res.last_decode_ms:.2f} ms per pass, mean {res.tpot_ms:.2f})"
        )
    lines.append(f"  {'total':30}{res.e2e_ms:10.2f} ms, {tokens_s} output tokens/s")
    if req.tp > 1:
        lines.append(f"  {'of which TP collectives':30}{res.comm_ms:10.2f} ms")
    lines.append(
        f"  memory per GPU {res.memory_gib:.2f} GiB of {res.usable_gib:.2f} usable (weights "
        f"{res.weights_gib:.2f}, KV cache "
        f"{res.kv_cache_gib:.2f}, prefill activations {res.activations_gib:.2f})\n"
        f"  {_verdict(res)}"
    )
    return "\n".join(lines)


def _verdict(res: ServeResult) -> str:
    """Whether the batch fits, and the largest that does; when none does, whether the weights
    alone overflow or one sequence's KV cache and prefill activations do."""
    fits = "fits" if res.fits else "does NOT fit"
    if res.max_batch > 0:
        return f"{fits}; the largest batch that fits is {res.max_batch:,}"
    if res.weights_gib > res.usable_gib:
        return (
            f"{fits}: the weights alone do not fit in GPU memory ({res.weights_gib:.2f} of "
            f"{res.usable_gib:.2f} GiB usable)"
        )
    return (
        f"{fits}: not even one sequence fits: its KV cache and prefill activations need more "
        f"than the {res.usable_gib - res.weights_gib:.2f} GiB the weights leave of "
        f"{res.usable_gib:.2f} GiB usable (shorten the prompt or generation, or raise --tp)"
    )


def _print(res: ServeResult, req: ServeRequest) -> None:
    print(serve_text(res, req))
