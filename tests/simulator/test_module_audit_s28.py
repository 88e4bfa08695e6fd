"""``predict --module`` after an audit with real modules (2026-12-08): what CUDA runs where the
meta device runs something else (``scaled_dot_product_attention``'s flash backend in 16 bits,
autocast), buffers in memory, the price of ops without a rule, sibling imports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forecast.kernels import OpFamily
from simulator.cli import main
from simulator.module_predict import trace_builder
from simulator.opgraph import Phase, Workload, ops_from_blocks

MODULES = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as sdpa_imported

D, H = 256, 4


class Attn(nn.Module):
    def __init__(self, causal, imported=False):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.causal, self.imported = causal, imported

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        fn = sdpa_imported if self.imported else F.scaled_dot_product_attention
        y = fn(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, t, D))


class GQA(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)  # 2 kv heads

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, H, D // H).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, H // 2, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, D))


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(D, H, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class Buffered(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.register_buffer("cache", torch.empty(n, dtype=torch.bfloat16))

    def forward(self, x):
        return self.lin(x)


class Sum(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return self.lin(x).sum(dim=1)


class Amp(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.lin, self.device = nn.Linear(D, D), device

    def forward(self, x):
        with torch.autocast(self.device, dtype=torch.bfloat16):
            return self.lin(x)


def x(b, s, dtype=torch.float32):
    return torch.randn(b, s, D, dtype=dtype)


def causal_bf16(b, s): return Attn(True).bfloat16(), (x(b, s, torch.bfloat16),)
def full_bf16(b, s): return Attn(False).bfloat16(), (x(b, s, torch.bfloat16),)
def imported_bf16(b, s): return Attn(True, imported=True).bfloat16(), (x(b, s, torch.bfloat16),)
def causal_fp32(b, s): return Attn(True), (x(b, s),)
def causal_fp16(b, s): return Attn(True).half(), (x(b, s, torch.float16),)
def mha_bf16(b, s): return MHA().bfloat16(), (x(b, s, torch.bfloat16),)
def gqa_bf16(b, s): return GQA().bfloat16(), (x(b, s, torch.bfloat16),)
def buffered(b, s): return Buffered(2 ** 36).bfloat16(), (x(b, s, torch.bfloat16),)
def summed(b, s): return Sum(), (x(b, s),)
def amp_cpu(b, s): return Amp("cpu"), (x(b, s),)
def amp_cuda(b, s): return Amp("cuda"), (x(b, s),)
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "audit_modules.py"
    path.write_text(MODULES)
    return path


def _predict(
    capsys: pytest.CaptureFixture[str], spec: str, *, gpu: str = "a100-pcie-80gb", **run: object
) -> tuple[int, dict[str, object]]:
    argv = ["predict", "--module", spec, "--gpu", gpu, "--json"]
    argv += ["--batch", str(run.get("batch", 2)), "--seq", str(run.get("seq", 1024))]
    argv += ["--mode", str(run.get("mode", "train"))]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else {"stderr": err})


def _families(modules: Path, func: str, *, flash: bool, mode: str = "train") -> set[OpFamily]:
    run = Workload(batch=2, seq=256, mode=mode)  # type: ignore[arg-type]
    trace = trace_builder(f"{modules}:{func}", run, flash=flash)
    graph = ops_from_blocks(trace.blocks, run.model_copy(update={"dtype": trace.dtype}))
    return {op.kernel.family for op in graph.ops if op.phase is not Phase.OPTIMIZER}


@pytest.mark.parametrize(
    "func", ["causal_bf16", "full_bf16", "imported_bf16", "mha_bf16", "gqa_bf16"]
)
def test_sdpa_in_16_bits_is_flash_attention_where_the_gpu_runs_it(modules: Path, func: str) -> None:
    """It was priced as meta's math path: q, k, v cast to fp32, fp32 score bmm and softmax
    (bf16 slower and larger than fp32), also inside ``nn.MultiheadAttention``."""
    fams = _families(modules, func, flash=True)
    assert OpFamily.ATTENTION in fams
    assert not fams & {OpFamily.BMM, OpFamily.SOFTMAX}
    # without FlashAttention-2 (a V100, a T4) the math path stays
    assert {OpFamily.BMM, OpFamily.SOFTMAX} <= _families(modules, func, flash=False)


def test_fp32_sdpa_keeps_the_math_path(modules: Path) -> None:
    assert {OpFamily.BMM, OpFamily.SOFTMAX} <= _families(modules, "causal_fp32", flash=True)


def test_causal_flash_costs_less_and_bf16_less_than_fp32(
    modules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At 32k tokens the causal bf16 module read 703 ms and 128 GiB (does not fit): the fp32
    S x S scores; FlashAttention-2 holds no score matrix."""
    spec = f"{modules}:%s"
    rc, causal = _predict(capsys, spec % "causal_bf16", batch=1, seq=32768, mode="inf")
    assert rc == 0 and causal["fits"] is True
    assert causal["memory_gib"] < 1.0  # type: ignore[operator]
    _, full = _predict(capsys, spec % "full_bf16", batch=1, seq=32768, mode="inf")
    attn_causal = causal["by_family_ms"]["attention"]  # type: ignore[index]
    attn_full = full["by_family_ms"]["attention"]  # type: ignore[index]
    assert 0.4 < attn_causal / attn_full < 0.7  # half the (query, key) blocks
    _, fp32 = _predict(capsys, spec % "causal_fp32", seq=2048)
    _, bf16 = _predict(capsys, spec % "causal_bf16", seq=2048)
    assert bf16["e2e_ms"] < fp32["e2e_ms"]  # type: ignore[operator]
    assert bf16["memory_gib"] < fp32["memory_gib"]  # type: ignore[operator]


def test_a_gpu_without_flash_attention_prices_the_math_path(
    modules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _predict(capsys, f"{modules}:causal_fp16", gpu="t4", seq=512)
    assert rc == 0
    assert "attention" not in out["by_family_ms"]  # type: ignore[operator]
    assert "bmm" in out["by_family_ms"]  # type: ignore[operator]


def test_buffers_are_held_in_memory(modules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 128 GiB bf16 buffer read 0.0001 GiB and fits: buffers were not counted."""
    rc, out = _predict(capsys, f"{modules}:buffered", seq=64, mode="inf")
    assert rc == 1 and out["fits"] is False
    assert out["memory_gib"] >= 128.0  # type: ignore[operator]


def test_an_op_without_a_rule_reads_its_largest_tensor_and_has_a_backward(
    modules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sum`` over 2 x 1024 x 256 fp32 was a copy of its (2, 256) output, no backward."""
    run = Workload(batch=2, seq=1024, mode="train")
    trace = trace_builder(f"{modules}:summed", run)
    assert trace.unmapped == {"sum": 1}
    fop = next(f for f in trace.blocks[0].ops if f.name.startswith("sum"))
    (fw,) = fop.fw
    assert fw.family is OpFamily.MEMORY and fw.dims == (2 * 1024, 256)
    assert [k.dims for k in fop.bw] == [(2 * 1024, 256)]


@pytest.mark.parametrize("func", ["amp_cpu", "amp_cuda"])
def test_autocast_is_refused_in_one_line(
    modules: Path, func: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was priced in fp32 without a word (meta tensors ignore autocast)."""
    rc, out = _predict(capsys, f"{modules}:{func}", seq=64)
    err = str(out["stderr"]).strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "torch.autocast" in err and "module.to(torch.bfloat16)" in err


def test_training_memory_is_at_least_inference_memory(
    modules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tied LM read 1.008 GiB training, 1.099 inference: the backward's gradient of the
    largest output was not counted."""
    _, train = _predict(capsys, f"{modules}:summed", seq=4096)
    _, inf = _predict(capsys, f"{modules}:summed", seq=4096, mode="inf")
    assert train["memory_gib"] >= inf["memory_gib"]  # type: ignore[operator]


def test_a_builder_imports_the_files_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``import model_def`` beside the builder failed (its folder was not on sys.path)."""
    (tmp_path / "model_def_s28.py").write_text(
        "import torch.nn as nn\nclass Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        return self.l(x)\n"
    )
    (tmp_path / "builder_s28.py").write_text(
        "import torch\nfrom model_def_s28 import Net\n"
        "def build(b, s):\n    return Net(), (torch.randn(b, s, 8),)\n"
    )
    rc, out = _predict(capsys, f"{tmp_path / 'builder_s28.py'}:build", seq=16, mode="inf")
    assert rc == 0 and out["e2e_ms"] > 0  # type: ignore[operator]


def test_lstm_views_and_stacks_are_not_unmapped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An LSTM listed ``unsafe_split`` (a view) and ``stack`` (a copy) as ops without a rule."""
    path = tmp_path / "lstm_s28.py"
    path.write_text(
        "import torch, torch.nn as nn\n"
        "def build(b, s):\n    return nn.LSTM(32, 32, batch_first=True), (torch.randn(b, s, 32),)\n"
    )
    rc, out = _predict(capsys, f"{path}:build", seq=16, mode="inf")
    assert rc == 0 and out["unmapped_ops"] == {}


def test_mixed_dtype_operands_are_refused_as_cuda_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bf16 module fed fp32 inputs was priced in bf16; torch on a GPU raises."""
    path = tmp_path / "mixed_s28.py"
    path.write_text(
        "import torch, torch.nn as nn\n"
        "def build(b, s):\n"
        "    return nn.Linear(64, 64).bfloat16(), (torch.randn(b, s, 64),)\n"
    )
    rc, out = _predict(capsys, f"{path}:build", seq=16)
    err = str(out["stderr"]).strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "addmm of torch.bfloat16 and torch.float32 operands, which CUDA refuses" in err
