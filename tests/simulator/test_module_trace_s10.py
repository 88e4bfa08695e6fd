"""``predict --module`` as a user meets it: small modules written the usual ways (MHA, SDPA,
a Llama block, a CNN, an LSTM, einsum, bf16, tuple/dict outputs, keyword inputs, frozen
weights), each traced on the meta device and checked against FLOPs counted by hand.

GEMM FLOPs here are ``2 * M * N * K`` per product (an FMA is two FLOPs), read from the kernel
dims, so the forecaster's convention of adding a bias row to every linear kernel stays out.
A training step's backward has, per GEMM ``C = A B``, ``dA = dC B^T`` and ``dB = A^T dC``
(each as many FLOPs as the forward), but autograd computes only the gradients someone needs:
not that of a model input or of a frozen (``requires_grad=False``) weight.
"""

from __future__ import annotations

import json
from collections import Counter
from math import prod
from pathlib import Path

import pytest
import torch

from forecast.kernels import Dtype, KernelSpec, OpFamily
from simulator.cli import main
from simulator.module_predict import load_builder, trace_builder
from simulator.module_trace import ModuleTrace, trace_module
from simulator.opgraph import OpGraph, Phase, Workload, build_ops, ops_from_blocks
from tests.support import SMALL_GPT2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2_module.py"
B, S = 2, 16  # batch and sequence of every trace below
T = B * S  # tokens

MODULES = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class MHABlock(nn.Module):
    def __init__(self, h=64, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = nn.MultiheadAttention(h, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class SDPA(nn.Module):
    def __init__(self, causal, h=64, heads=4):
        super().__init__()
        self.causal, self.heads = causal, heads
        self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (
            t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(h, -1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


class Llama(nn.Module):
    def __init__(self, h=64, heads=4, kv=2, ffn=176):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, kv * self.d, bias=False)
        self.v = nn.Linear(h, kv * self.d, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate = nn.Linear(h, ffn, bias=False)
        self.up = nn.Linear(h, ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        f = torch.outer(torch.arange(s).float(), inv)
        emb = torch.cat((f, f), -1)
        cos, sin = emb.cos(), emb.sin()
        y = self.n1(x)
        q = self.q(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(y).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(y).view(b, s, self.kv, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(self.heads // self.kv, dim=1)
        v = v.repeat_interleave(self.heads // self.kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(self.pool(F.relu(self.bn(self.conv(x)))).flatten(1))


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, x):
        return self.up(self.dw(self.c(x)))


class LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.lstm(x)[0])


class Ein(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 48))

    def forward(self, x, y):
        z = torch.einsum("bsh,hk->bsk", x, self.w)
        return torch.einsum("bsk,btk->bst", z, y)


class TwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x, scale=1.0):
        h = self.a(x)
        return {"h": h, "y": (self.b(h) * scale, h)}


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(64, 64).requires_grad_(False)
        self.a = nn.Linear(64, 4, bias=False)
        self.b = nn.Linear(4, 64, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


class NoGrad(nn.Module):
    # a frozen feature extractor the usual ways: under torch.no_grad(), then detach()
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(64, 128)
        self.mid = nn.Linear(128, 128)
        self.head = nn.Linear(128, 64, bias=False)

    def forward(self, x):
        with torch.no_grad():
            h = self.enc(x)
        return self.head(torch.relu(self.mid(h)).detach()) + self.head(h)


class NoParams(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class TorchDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.dropout(self.lin(x), 0.1, self.training)


def x(b, s, h=64):
    return torch.randn(b, s, h)


def mha(b, s): return MHABlock(), (x(b, s),)
def sdpa(b, s): return SDPA(False), (x(b, s),)
def sdpa_causal(b, s): return SDPA(True), (x(b, s),)
def llama(b, s): return Llama(), (x(b, s),)
def cnn(b, s): return CNN(), (torch.randn(b, 3, s, s),)
def convs(b, s): return Convs(), (torch.randn(b, 3, s, s),)
def lstm(b, s): return LSTM(), (x(b, s, 32),)
def ein(b, s): return Ein(), (x(b, s, 32), x(b, s, 48))
def bf16(b, s): return TwoOut().to(torch.bfloat16), (x(b, s).bfloat16(),)
def two_out(b, s): return TwoOut(), (x(b, s),)
def kwargs_only(b, s): return TwoOut(), {"x": x(b, s), "scale": 2.0}
def args_and_kwargs(b, s): return TwoOut(), (x(b, s),), {"scale": 2.0}
def bare_tensor(b, s): return TwoOut(), x(b, s)
def frozen(b, s): return Frozen(), (x(b, s),)
def no_params(b, s): return NoParams(), (x(b, s),)
def no_grad(b, s): return NoGrad(), (x(b, s),)
def torch_dropout(b, s): return TorchDropout(), (x(b, s, 16),)
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "user_modules.py"
    path.write_text(MODULES)
    return path


def _trace(path: Path, func: str, mode: str = "train") -> tuple[ModuleTrace, OpGraph]:
    run = Workload(batch=B, seq=S, mode=mode)  # type: ignore[arg-type]
    trace = trace_builder(f"{path}:{func}", run)
    return trace, ops_from_blocks(trace.blocks, run.model_copy(update={"dtype": trace.dtype}))


def _fma_flops(graph: OpGraph, phase: Phase) -> int:
    """2 * (product of the dims) per GEMM kernel: 2 * B * M * N * K."""
    gemms = (OpFamily.LINEAR, OpFamily.BMM)
    return sum(
        op.count * 2 * prod(op.kernel.dims)
        for op in graph.ops
        if op.phase is phase and op.kernel.family in gemms
    )


def _stepped_params(trace: ModuleTrace) -> int:
    """Parameter elements the optimizer steps (and whose gradients accumulate)."""
    return sum(r * c for fop in trace.blocks[0].ops for r, c in fop.params)


def _attention_flops(heads: int, d: int) -> int:
    """``Q K^T`` and ``P V``: two (S x d x S) products per (batch, head)."""
    return 2 * 2 * B * heads * S * S * d


def test_mha_block_flops_backward_and_parameters(modules: Path) -> None:
    h = 64
    trace, graph = _trace(modules, "mha")
    assert trace.unmapped == {}
    # in_proj (h -> 3h), attention, out_proj (h -> h), fc1 (h -> 4h), fc2 (4h -> h)
    fw = 2 * T * h * 3 * h + _attention_flops(4, 16) + 2 * T * h * h + 2 * 2 * T * h * 4 * h
    assert _fma_flops(graph, Phase.FORWARD) == fw == 3_276_800
    # ln_1 (weights) comes first: every GEMM's operands need gradients
    assert _fma_flops(graph, Phase.BACKWARD) == 2 * fw
    # two layer norms, in_proj, out_proj, fc1, fc2 (weights + biases)
    params = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    assert _stepped_params(trace) == trace.num_params == params == 49_984


@pytest.mark.parametrize("func", ["sdpa", "sdpa_causal"])
def test_sdpa_flops_and_no_gradient_for_the_input(modules: Path, func: str) -> None:
    h = 64
    trace, graph = _trace(modules, func)
    # the meta device runs SDPA's math path: the full S x S scores, a causal mask added
    fw = 2 * T * h * 3 * h + _attention_flops(4, 16) + 2 * T * h * h
    assert _fma_flops(graph, Phase.FORWARD) == fw
    assert {k.family for fop in trace.blocks[0].ops for k in fop.fw} >= {OpFamily.SOFTMAX}
    # the qkv projection's input is the model input: no dgrad GEMM for it
    assert _fma_flops(graph, Phase.BACKWARD) == 2 * fw - 2 * T * 3 * h * h


def test_llama_block_flops_and_rotary_transcendentals(modules: Path) -> None:
    h, kv, d, ffn = 64, 2, 16, 176
    trace, graph = _trace(modules, "llama")
    # q, o (h -> h); k, v (h -> kv * d); gate, up (h -> ffn); down (ffn -> h); 4 heads
    fw = 2 * T * (2 * h * h + 2 * h * kv * d + 3 * h * ffn) + _attention_flops(4, d)
    assert _fma_flops(graph, Phase.FORWARD) == fw == 3_080_192
    assert _fma_flops(graph, Phase.BACKWARD) == 2 * fw  # RMSNorm's weight comes first
    assert _stepped_params(trace) == 2 * h + 2 * h * h + 2 * h * kv * d + 3 * h * ffn
    # cos and sin are one-input transcendentals, priced like tanh, not unmapped copies
    assert not {"cos", "sin"} & set(trace.unmapped)
    ops = [k.op for fop in trace.blocks[0].ops for k in fop.fw]
    assert ops.count("tanh") >= 4  # cos, sin, two rsqrt


def test_cnn_convolution_is_a_gemm(modules: Path) -> None:
    trace, graph = _trace(modules, "cnn")
    # conv 3 -> 16, 3 x 3, padding 1 on 16 x 16: 2 * N * Ho * Wo * Cout * Cin * kh * kw
    conv = 2 * B * S * S * 16 * 3 * 3 * 3
    fc = 2 * B * (16 * 8 * 8) * 10
    assert _fma_flops(graph, Phase.FORWARD) == conv + fc
    assert "convolution" not in trace.unmapped
    # batch norm and max pool have no rule: listed, priced as copies, no crash
    assert trace.unmapped == {"max_pool2d_with_indices": 1, "native_batch_norm": 1}
    # conv: the weight gradient only (its input is the image); fc: both
    assert _fma_flops(graph, Phase.BACKWARD) == conv + 2 * fc
    assert _stepped_params(trace) == (16 * 27 + 16) + 2 * 16 + (1024 * 10 + 10)


def test_transposed_and_grouped_convolutions(modules: Path) -> None:
    """A transposed convolution is a GEMM too; a grouped (here depthwise: 8 groups of one
    channel) one is a sliver of a GEMM per group, memory-bound: listed, priced as a copy."""
    trace, graph = _trace(modules, "convs", "inf")
    conv = 2 * B * S * S * 8 * 3 * 9  # 3 -> 8, 3 x 3, padding 1
    # transposed 8 -> 4, 2 x 2, stride 2, on the depthwise conv's 14 x 14 (no padding):
    # every input pixel meets Cout * kh * kw outputs
    transposed = 2 * B * 14 * 14 * 8 * 4 * 4
    assert _fma_flops(graph, Phase.FORWARD) == conv + transposed
    assert trace.unmapped == {"convolution": 1}


def test_lstm_unrolled_flops(modules: Path) -> None:
    i, h = 32, 64
    trace, graph = _trace(modules, "lstm")
    step_x, step_h = 2 * B * i * 4 * h, 2 * B * h * 4 * h  # the four gates at once
    fc = 2 * T * h * 10
    assert _fma_flops(graph, Phase.FORWARD) == S * (step_x + step_h) + fc
    # no gradient for the input sequence, nor for the zero initial state of step 0
    assert _fma_flops(graph, Phase.BACKWARD) == S * (step_x + 2 * step_h) - step_h + 2 * fc
    assert _stepped_params(trace) == 4 * h * (i + h) + 2 * 4 * h + h * 10 + 10


def test_einsum_gradients_only_where_needed(modules: Path) -> None:
    trace, graph = _trace(modules, "ein")
    proj, scores = 2 * T * 32 * 48, 2 * B * S * S * 48
    assert trace.unmapped == {}
    assert _fma_flops(graph, Phase.FORWARD) == proj + scores
    # the weight's gradient (not x's) and z's gradient (not y's): one GEMM each
    assert _fma_flops(graph, Phase.BACKWARD) == proj + scores
    assert _stepped_params(trace) == 32 * 48


def test_bf16_and_nested_outputs(modules: Path) -> None:
    trace, graph = _trace(modules, "bf16")
    assert trace.dtype is Dtype.BF16
    assert {o.kernel.dtype for o in graph.ops if o.phase is not Phase.OPTIMIZER} == {Dtype.BF16}
    assert {o.kernel.dtype for o in graph.ops if o.phase is Phase.OPTIMIZER} == {Dtype.FP32}
    assert _fma_flops(graph, Phase.FORWARD) == 2 * (2 * T * 64 * 128)


def _kernels(graph: OpGraph) -> list[tuple[KernelSpec, Phase]]:
    return sorted(((o.kernel, o.phase) for o in graph.ops), key=repr)


@pytest.mark.parametrize("func", ["kwargs_only", "args_and_kwargs"])
def test_keyword_inputs(modules: Path, func: str) -> None:
    """``(module, {name: input})`` and ``(module, args, kwargs)`` trace like positional
    inputs (``scale`` a Python float either way: the same ``mulu``)."""
    _, positional = _trace(modules, "two_out")
    _, keyword = _trace(modules, func)
    assert _kernels(keyword) == _kernels(positional)


def test_frozen_weights_get_no_gradient_and_no_optimizer_state(modules: Path) -> None:
    trace, graph = _trace(modules, "frozen")
    base, a, b = 2 * T * 64 * 64, 2 * T * 64 * 4, 2 * T * 4 * 64
    assert _fma_flops(graph, Phase.FORWARD) == base + a + b
    # base: nothing (frozen weight, input); a: weight gradient; b: both
    assert _fma_flops(graph, Phase.BACKWARD) == a + 2 * b
    assert _stepped_params(trace) == 64 * 4 + 4 * 64
    assert trace.num_params == 64 * 64 + 64 + 2 * 256


def test_no_grad_and_detach_get_no_backward_and_no_optimizer_state(modules: Path) -> None:
    """What runs under ``torch.no_grad()`` (enc) or only feeds a ``detach()`` (mid) has no
    backward kernel and its weights no gradient: the step stays the head's weight gradients
    (read twice, charged once), as autograd runs it. Before, enc and mid were priced with
    both gradients and Adam state."""
    trace, graph = _trace(modules, "no_grad")
    enc, mid, head = 2 * T * 64 * 128, 2 * T * 128 * 128, 2 * T * 128 * 64
    assert _fma_flops(graph, Phase.FORWARD) == enc + mid + 2 * head
    assert _fma_flops(graph, Phase.BACKWARD) == 2 * head  # dW of each read, no dX
    assert _stepped_params(trace) == 128 * 64
    assert trace.trainable_params == 128 * 64
    backward = [op.name for op in graph.ops if op.phase is Phase.BACKWARD]
    assert not [n for n in backward if "relu" in n or "add" in n]  # relu's would feed only mid


def test_frozen_weights_memory(modules: Path) -> None:
    """fp32: 4 bytes of weight for every parameter; gradient (4) and Adam's two moments (8)
    only for the 512 trainable ones; no activations beyond the kernels' outputs."""
    from forecast.gpus import load_gpu
    from simulator.module_predict import module_memory

    trace, _ = _trace(modules, "frozen")
    mem = module_memory(trace, Workload(batch=B, seq=S, mode="train"), load_gpu("v100-pcie-32gb"))
    assert mem.weights_bytes == 4 * trace.num_params
    assert mem.gradients_bytes == 4 * 512
    assert mem.optimizer_bytes == 8 * 512


def _predict(spec: str, mode: str = "train") -> list[str]:
    base = ["predict", "--gpu", "v100-pcie-32gb", "--batch", str(B), "--seq", str(S)]
    return [*base, "--mode", mode, "--latency-model", "roofline", "--json", "--module", spec]


def test_no_parameters_no_optimizer_step(modules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, graph = _trace(modules, "no_params")
    assert [o for o in graph.ops if o.phase is Phase.OPTIMIZER] == []
    assert main(_predict(f"{modules}:no_params")) == 0
    assert json.loads(capsys.readouterr().out)["optimizer_ms"] == 0.0


def test_torch_dropout_is_a_dropout_kernel(modules: Path) -> None:
    trace, _ = _trace(modules, "torch_dropout")
    assert trace.unmapped == {}
    assert "dropout" in [k.op for fop in trace.blocks[0].ops for k in fop.fw]
    inference, _ = _trace(modules, "torch_dropout", "inf")
    assert "dropout" not in [k.op for fop in inference.blocks[0].ops for k in fop.fw]


@pytest.mark.parametrize(
    ("func", "says"),
    [("bare_tensor", "got (TwoOut, Tensor)"), ("two_out_missing", "no function")],
)
def test_bad_builder_return_is_one_line_exit_2(
    modules: Path, capsys: pytest.CaptureFixture[str], func: str, says: str
) -> None:
    assert main(_predict(f"{modules}:{func}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and says in err


SMALL = SMALL_GPT2


@pytest.mark.parametrize("mode", ["train", "inf"])
def test_traced_gpt2_kernels_match_the_analytic_builder(mode: str) -> None:
    """The example module and ``--model`` of the same config (untied head, as the example's)
    launch the same GEMM, softmax, layer-norm, embedding, dropout and mask kernels, forward
    and backward, and step the same parameters. They differ where the code differs: the
    example's fused ``GELU(approximate="tanh")`` against HF's eight-kernel ``gelu_new``, the
    contiguous copies its ``q @ k^T`` makes, and its ``arange``."""
    run = Workload(batch=2, seq=64, mode=mode)  # type: ignore[arg-type]
    build = load_builder(f"{EXAMPLE}:build")
    cfg = build.__globals__["GPT2Config"](2, 128, 4, 1000, 256)
    with torch.device("meta"):
        module, args = build(run.batch, run.seq, cfg)
        traced = ops_from_blocks(trace_module(module, args, train=mode == "train").blocks, run)
    analytic = build_ops(SMALL.model_copy(update={"tied_embeddings": False}), run)
    same = {"embedding", "dropout", "dropout_backward", "masked_fill", "fill", "adam"}

    def kernels(graph: OpGraph) -> Counter[tuple[KernelSpec, Phase]]:
        keep = (OpFamily.LINEAR, OpFamily.BMM, OpFamily.SOFTMAX, OpFamily.LAYERNORM)
        return Counter(
            (o.kernel, o.phase)
            for o in graph.ops
            for _ in range(o.count)
            if o.kernel.family in keep
            or o.phase is Phase.OPTIMIZER
            or (o.kernel.op in same and o.kernel.dims != (1, 64))  # not the arange
        )

    assert kernels(traced) == kernels(analytic)
