"""Check `simulator.inventory_compile` against TorchInductor itself: compile the GPT-2 of
``examples/gpt2_module.py`` and a BERT and a Llama written here as HF's eager ones (eval mode,
CPU backend: the same fusion and layout decisions as on a GPU, C++ kernels in place of
Triton; no pattern rewrites, as PyTorch 2.1 left eager attention) and count the kernels one
forward pass launches, beside the ``hf-compile`` inventory of the same shapes.

Run: ``python benchmarks/inductor_inventory.py`` (needs a C++ compiler; about a minute).
Expected: the same library calls (``addmm``/``mm`` = our linears, ``bmm``) and as many
generated kernels as our other kernels. The GPT-2's head splits differ in form, not number:
Inductor copies q and k in one kernel and v inside the softmax kernel, we price q, k and v
in one copy (the same bytes).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.gpt2_module import GPT2, GPT2Config
from forecast.kernels import OpFamily
from simulator.models import ModelSpec
from simulator.opgraph import Workload, build_ops

LAYERS, HIDDEN, HEADS, VOCAB, POSITIONS, BATCH, SEQ = 2, 128, 4, 1000, 256, 2, 64
FFN = 344  # the Llama's (SwiGLU) intermediate width


class RMSNorm(nn.Module):
    """HF ``LlamaRMSNorm``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


class LlamaLayer(nn.Module):
    """HF ``LlamaDecoderLayer`` with eager attention (multi-head, an additive mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in "qkvo")
        self.gate, self.up = (nn.Linear(HIDDEN, FFN, bias=False) for _ in "gu")
        self.down = nn.Linear(FFN, HIDDEN, bias=False)
        self.norm_1, self.norm_2 = RMSNorm(), RMSNorm()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape[0], x.shape[1], HIDDEN // HEADS
        h = self.norm_1(x)
        q, k, v = (p(h).view(b, s, HEADS, d).transpose(1, 2) for p in (self.q, self.k, self.v))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        scores = torch.softmax(q @ k.transpose(2, 3) / d**0.5 + mask, dim=-1)
        x = x + self.o((scores @ v).transpose(1, 2).reshape(b, s, HIDDEN))
        h = self.norm_2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """HF ``LlamaForCausalLM``: token table, layers, final norm, untied head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(LlamaLayer() for _ in range(LAYERS))
        self.norm, self.head = RMSNorm(), nn.Linear(HIDDEN, VOCAB, bias=False)
        angles = torch.outer(torch.arange(SEQ), torch.arange(HIDDEN // HEADS // 2) / SEQ)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.head(self.norm(x))


class BertLayer(nn.Module):
    """HF ``BertLayer`` (post-norm, an additive padding mask, eval mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in "qkvo")
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)
        self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape[0], x.shape[1], HIDDEN // HEADS
        q, k, v = (p(x).view(b, s, HEADS, d).permute(0, 2, 1, 3) for p in (self.q, self.k, self.v))
        scores = torch.softmax(q @ k.transpose(-1, -2) / d**0.5 + mask, dim=-1)
        x = self.ln_1(self.o((scores @ v).permute(0, 2, 1, 3).reshape(b, s, HIDDEN)) + x)
        return self.ln_2(self.fc2(nn.functional.gelu(self.fc1(x))) + x)


class Bert(nn.Module):
    """HF ``BertForSequenceClassification``: three embeddings and their norm, layers, the
    pooler over each sequence's first token and a 2-way classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.word, self.position = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
        self.token_type, self.ln = nn.Embedding(2, HIDDEN), nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(BertLayer() for _ in range(LAYERS))
        self.pooler, self.classifier = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word(tokens) + self.token_type(torch.zeros_like(tokens)) + self.position(positions)
        x = self.ln(x)
        mask = torch.zeros(tokens.shape[0], 1, 1, tokens.shape[1], device=tokens.device)
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def inductor_launches(model: nn.Module) -> Counter[str]:
    """Library calls by name and generated kernels ("generated") of one compiled forward,
    without Inductor's attention rewrites (as PyTorch 2.1 left eager attention)."""
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.no_grad(), inductor_config.patch(pattern_matcher=False):
        _, codes = run_and_get_code(torch.compile(model.eval()), tokens)
    code = "\n".join(codes)
    body = code[code.index("def call(") :]
    out: Counter[str] = Counter()
    for line in body.splitlines():
        if m := re.match(r"\s*extern_kernels\.(\w+)\(", line):
            out[m.group(1)] += 1
        elif re.match(r"\s*cpp_fused_\w+\(", line):
            out["generated"] += 1
    return out


def ours(architecture: str) -> Counter[str]:
    """Kernel launches of the hf-compile inventory of the same model and pass."""
    llama = architecture == "llama"
    spec = ModelSpec(
        id=f"example-{architecture}",
        architecture=architecture,  # type: ignore[arg-type]
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_heads=HEADS,
        ffn_hidden_size=FFN if llama else 4 * HIDDEN,
        vocab_size=VOCAB,
        max_positions=POSITIONS,
        activation="swiglu" if llama else "gelu",
        norm="rmsnorm" if llama else "layernorm",
        tied_embeddings=not llama,
    )
    graph = build_ops(spec, Workload(batch=BATCH, seq=SEQ, mode="inf", framework="hf-compile"))
    out: Counter[str] = Counter()
    for op in graph.ops:
        fam = op.kernel.family
        key = {OpFamily.LINEAR: "linear", OpFamily.BMM: "bmm"}.get(fam, "generated")
        out[key] += op.count
    return out


def main() -> None:
    """Print both counts for each model."""
    config = GPT2Config(LAYERS, HIDDEN, HEADS, VOCAB, POSITIONS)
    for name, model in (("gpt2", GPT2(config)), ("bert", Bert()), ("llama", Llama())):
        theirs, mine = inductor_launches(model), ours(name)
        linear = theirs["addmm"] + theirs["mm"]
        same = (linear, theirs["bmm"], theirs["generated"]) == (
            mine["linear"],
            mine["bmm"],
            mine["generated"],
        )
        print(
            f"{name}: library GEMMs Inductor {linear} / ours {mine['linear']}, bmm "
            f"{theirs['bmm']} / {mine['bmm']}, generated kernels {theirs['generated']} / "
            f"{mine['generated']}: {'same launches' if same else 'DIFFERENT launches'}"
        )


if __name__ == "__main__":
    main()
