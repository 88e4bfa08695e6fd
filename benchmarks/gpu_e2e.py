"""Time whole Hugging Face models on a lent GPU as NeuSight's end-to-end labels were timed.

The labels in ../shared/data/neusight/labels are Hugging Face eager PyTorch models built from
the configs in ../shared/data/neusight/models, FP32, eager attention: ``fw_latency`` the
forward pass, ``bwall_latency`` ``backward()`` with gradient accumulation, no optimizer step.
This script measures the same runs on the GPU it runs on (a GPU outside the data: issue 3)
in fp32 and, as a tensor-core check (issue 5), with the weights in bf16. Random weights
(built on the GPU, no download); inference in ``eval()`` under ``no_grad``; training in
``train()`` (dropout on), the backward from the model's outputs with a ones gradient, the
``.grad`` buffers kept so that every timed backward accumulates into them.

Timing: CUDA events around each pass, 2 warm-up steps, then the mean of the 5 fastest of
``--repeats`` (default 10; NeuSight: 5 fastest of 25, cut here to fit a lease). Runs go
cheapest first; one that would end past ``--budget-s`` (by its first step's time) is skipped
and listed. Each result is one JSON line appended to ``--out`` as it is measured.

    python benchmarks/gpu_e2e.py --models DIR --out FILE.jsonl [--device cuda] [--budget-s 80]
    python benchmarks/gpu_e2e.py --compare FILE.jsonl [--data DIR]   # here: against tilesim

``--compare`` runs ``tilesim predict --runs`` (framework hf-eager, each line's GPU name as the
GPU, the configs from DATA/models) on the measured runs and prints measured, predicted and the
error of each, with the mean and largest absolute error per dtype.

Needs ``transformers`` (on the lent machine's image; not a dependency of tilesim).
``--device cpu --tiny`` runs the same path on the CPU with two-layer models, 64 tokens (how it
is tested).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# (config, mode, seq, batch): the NVIDIA label runs (no fusion, one GPU), in rising cost
RUNS = [
    ("bert_large", "inf", 512, 8),
    ("gpt2_large", "inf", 1024, 4),
    ("bert_large", "train", 512, 2),
    ("bert_large", "inf", 512, 16),
    ("gpt2_large", "inf", 1024, 8),
    ("gpt2_large", "train", 1024, 1),
    ("gpt3_xl", "inf", 2048, 2),
    ("opt_13", "inf", 2048, 2),
    ("bert_large", "train", 512, 8),
    ("gpt2_large", "train", 1024, 4),
    ("gpt3_27", "inf", 2048, 2),
    ("gpt3_xl", "train", 2048, 1),
    ("opt_13", "train", 2048, 1),
    ("gpt3_27", "train", 2048, 1),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(config: dict, device: str, dtype: torch.dtype, tiny: bool) -> torch.nn.Module:
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    if tiny:
        for key in ("n_layer", "num_hidden_layers"):
            if hasattr(cfg, key):
                setattr(cfg, key, 2)
    cfg._attn_implementation = "eager"
    arch = (config.get("architectures") or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, arch, None)
    if arch == "BertLMHeadModel":  # NeuSight's BERT trace ends in MLM + NSP heads
        cls = transformers.BertForPreTraining
    if cls is None:
        raise SystemExit(
            f"transformers has no model class {arch!r} (from the config's architectures)"
        )
    with torch.device(device):
        model = cls._from_config(cfg, attn_implementation="eager", dtype=dtype)
    return model.to(device)


def _outputs(out: Any) -> list[torch.Tensor]:
    vals = out.to_tuple() if hasattr(out, "to_tuple") else out
    return [v for v in vals if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _timer(device: str) -> Callable[[], float]:
    if device == "cpu":
        t0 = time.perf_counter()
        return lambda: time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()

    def stop() -> float:
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return stop


def step(model: torch.nn.Module, ids: torch.Tensor, mode: str, device: str) -> tuple[float, float]:
    """Forward and backward seconds of one step (backward 0 for inference)."""
    if mode == "inf":
        with torch.no_grad():
            t = _timer(device)
            model(input_ids=ids)
            return t(), 0.0
    t = _timer(device)
    outs = _outputs(model(input_ids=ids))
    fw = t()
    grads = [torch.ones_like(o) for o in outs]
    t = _timer(device)
    torch.autograd.backward(outs, grads)
    return fw, t()


def measure(args: argparse.Namespace, run: tuple, dtype: str, deadline: float) -> dict:
    name, mode, seq, batch = run
    if args.tiny:
        seq, batch = min(seq, 64), 1
    config = json.loads((args.models / f"{name}.json").read_text())
    rec: dict[str, object] = {"model": name, "mode": mode, "seq": seq, "batch": batch}
    rec.update(dtype=dtype, run=f"{name}-{mode}-{seq}-{batch}", device=args.device_name)
    model = build(config, args.device, DTYPES[dtype], args.tiny)
    model.train(mode == "train")
    vocab = int(getattr(model.config, "vocab_size", 1000))
    ids = torch.randint(0, vocab, (batch, seq), device=args.device)
    t0 = time.perf_counter()
    step(model, ids, mode, args.device)
    first = time.perf_counter() - t0
    if time.perf_counter() + first * (1 + args.repeats) > deadline:
        raise TimeoutError(f"first step {first:.2f} s; the rest would pass the budget")
    step(model, ids, mode, args.device)
    times = sorted((step(model, ids, mode, args.device) for _ in range(args.repeats)), key=sum)
    best = times[:5]
    fw = sum(t[0] for t in best) / len(best) * 1e3
    bw = sum(t[1] for t in best) / len(best) * 1e3
    rec.update(fw_ms=fw, bw_ms=bw, e2e_ms=fw + bw, repeats=args.repeats, fastest=len(best))
    rec["params"] = sum(p.numel() for p in model.parameters())
    return rec


def compare(measured: Path, data: Path) -> int:
    """Measured against ``tilesim predict`` for every line of ``measured``."""
    rows = [json.loads(line) for line in measured.read_text().splitlines() if line.strip()]
    keys = ("batch", "seq", "mode", "dtype")
    runs = [
        {"model": str(data / "models" / f"{r['model']}.json"), "gpu": r["device"]}
        | {k: r[k] for k in keys}
        | {"framework": "hf-eager"}
        for r in rows
    ]
    cmd = [sys.executable, "-m", "simulator", "predict", "--runs", "/dev/stdin", "--json"]
    text = "".join(json.dumps(r) + "\n" for r in runs)
    res = subprocess.run(cmd, input=text, capture_output=True, text=True, check=False)
    preds = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    if len(preds) != len(rows):
        print(res.stderr.strip(), file=sys.stderr)
        return 1
    errs: dict[str, list[float]] = {}
    print(f"{'run':28} {'dtype':5} {'measured ms':>12} {'tilesim ms':>11} {'error':>8}")
    for r, pr in zip(rows, preds, strict=True):
        if "error" in pr:
            print(f"{r['run']:28} {r['dtype']:5} {r['e2e_ms']:12.2f} {pr['error']}")
            continue
        err = pr["e2e_ms"] / r["e2e_ms"] - 1
        errs.setdefault(r["dtype"], []).append(abs(err))
        print(f"{r['run']:28} {r['dtype']:5} {r['e2e_ms']:12.2f} {pr['e2e_ms']:11.2f} {err:+8.1%}")
    for dt, e in errs.items():
        print(f"{dt}: {len(e)} runs, mean |error| {sum(e) / len(e):.1%}, max {max(e):.1%}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", type=Path, help="measured JSONL to score tilesim against")
    p.add_argument("--data", type=Path, default=Path("../shared/data/neusight"))
    p.add_argument("--models", type=Path, help="folder of config JSONs")
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=80.0)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--tiny", action="store_true", help="two layers (CPU tests)")
    args = p.parse_args()
    if args.compare is not None:
        return compare(args.compare, args.data)
    if args.models is None or args.out is None:
        p.error("--models and --out are required to measure")
    deadline = time.perf_counter() + args.budget_s
    dev = args.device
    args.device_name = torch.cuda.get_device_name() if dev != "cpu" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # the labels' FP32: no TF32
    args.out.parent.mkdir(parents=True, exist_ok=True)
    skipped = []
    for run in RUNS:
        for dtype in args.dtypes.split(","):
            label = f"{run} {dtype}"
            if time.perf_counter() >= deadline:
                skipped.append(f"{label}: budget spent")
                continue
            try:
                rec = measure(args, run, dtype, deadline)
            except (TimeoutError, RuntimeError, ValueError) as e:  # OOM is a RuntimeError
                skipped.append(f"{label}: {str(e).splitlines()[0] if str(e) else e!r}")
                rec = None
            finally:
                if dev != "cpu":
                    torch.cuda.empty_cache()
            if rec is not None:
                with args.out.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(json.dumps(rec), flush=True)
    for s in skipped:
        print("skipped:", s, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
