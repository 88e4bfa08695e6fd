"""Check `simulator.inventory_compile` against TorchInductor itself: compile the GPT-2 of
``examples/gpt2_module.py`` (eval mode, CPU backend: the same fusion and layout decisions as
on a GPU, C++ kernels in place of Triton) and count the kernels one forward pass launches,
beside the ``hf-compile`` inventory of the same shapes.

Run: ``python benchmarks/inductor_inventory.py`` (needs a C++ compiler; about 30 s to compile).
Expected: the same library calls (``addmm``/``mm`` = our linears, ``bmm``) and as many
generated kernels as our other kernels (on 2026-12-07, torch 2.13: 9, 4 and 13 of each). The
head splits differ in form, not number: Inductor copies q and k in one kernel and v inside
the softmax kernel, we price q, k and v in one copy (the same bytes).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.gpt2_module import GPT2, GPT2Config
from forecast.kernels import OpFamily
from simulator.models import ModelSpec
from simulator.opgraph import Workload, build_ops

LAYERS, HIDDEN, HEADS, VOCAB, POSITIONS, BATCH, SEQ = 2, 128, 4, 1000, 256, 2, 64


def inductor_launches() -> Counter[str]:
    """Library calls by name and generated kernels ("generated") of one compiled forward."""
    cfg = GPT2Config(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, positions=POSITIONS)
    model = GPT2(cfg).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(model), tokens)
    code = "\n".join(codes)
    body = code[code.index("def call(") :]
    out: Counter[str] = Counter()
    for line in body.splitlines():
        if m := re.match(r"\s*extern_kernels\.(\w+)\(", line):
            out[m.group(1)] += 1
        elif re.match(r"\s*cpp_fused_\w+\(", line):
            out["generated"] += 1
    return out


def ours() -> Counter[str]:
    """Kernel launches of the hf-compile inventory of the same model and pass."""
    spec = ModelSpec(
        id="example-gpt2",
        architecture="gpt2",
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_heads=HEADS,
        ffn_hidden_size=4 * HIDDEN,
        vocab_size=VOCAB,
        max_positions=POSITIONS,
        activation="gelu",
    )
    graph = build_ops(spec, Workload(batch=BATCH, seq=SEQ, mode="inf", framework="hf-compile"))
    out: Counter[str] = Counter()
    for op in graph.ops:
        fam = op.kernel.family
        key = {OpFamily.LINEAR: "linear", OpFamily.BMM: "bmm"}.get(fam, "generated")
        out[key] += op.count
    return out


def main() -> None:
    """Print both counts and the difference."""
    theirs, mine = inductor_launches(), ours()
    linear = theirs["addmm"] + theirs["mm"]
    print(f"library GEMMs: Inductor {linear} (addmm/mm), ours {mine['linear']} linear")
    print(f"library bmm:   Inductor {theirs['bmm']}, ours {mine['bmm']}")
    print(f"generated:     Inductor {theirs['generated']}, ours {mine['generated']} other kernels")
    same = theirs["generated"] == mine["generated"] and theirs["bmm"] == mine["bmm"]
    print("same launches" if same and linear == mine["linear"] else "DIFFERENT launches")


if __name__ == "__main__":
    main()
