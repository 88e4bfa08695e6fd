"""Single-GPU whole-model forecast against closed forms and metamorphic relations: the
optimizer's state and tied weights, the activation memory of unfused Megatron attention,
Hugging Face config defaults, and SDPA traced from a module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from forecast.gpus import load_gpu
from forecast.kernels import Dtype
from forecast.predict import load_latency_model
from simulator.e2e import predict_run
from simulator.memory import estimate_memory, layer_activation_bytes
from simulator.models import load_model
from simulator.opgraph import Phase, Workload, build_ops

ROOFLINE = load_latency_model("roofline")


def _adam_elements(model_id: str, framework: str, dtype: str = "fp32") -> int:
    run = Workload(batch=1, seq=64, mode="train", framework=framework, dtype=dtype)
    ops = [op for op in build_ops(load_model(model_id), run).ops if op.phase is Phase.OPTIMIZER]
    assert len({op.kernel.dims for op in ops}) == 1
    return ops[0].kernel.dims[0] * ops[0].kernel.dims[1]


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8"])
def test_adam_steps_fp32_state_whatever_the_dtype(framework: str, dtype: str) -> None:
    """Memory counts fp32 moments (and fp32 master weights for 16-bit types); the optimizer's
    kernels stream that same fp32 state, so a bf16 step's Adam takes the fp32 step's time (it
    ran its kernels in bf16: half the bytes, half the time)."""
    model, gpu = load_model("llama3-8b"), load_gpu("h100-sxm5-80gb")
    run = Workload(batch=1, seq=512, mode="train", framework=framework, dtype=dtype)
    graph = build_ops(model, run)
    assert {op.kernel.dtype for op in graph.ops if op.phase is Phase.OPTIMIZER} == {Dtype.FP32}
    low = predict_run(model, gpu, run, ROOFLINE)
    full = predict_run(model, gpu, run.model_copy(update={"dtype": Dtype.FP32}), ROOFLINE)
    assert low.optimizer_ms == full.optimizer_ms
    assert low.e2e_ms < full.e2e_ms  # the model itself runs faster in the low precision


@pytest.mark.parametrize(
    ("model_id", "framework"),
    [
        ("tiny-gpt", "hf-eager"),  # tied lm_head: was counted twice (+13%)
        ("switch-base-4", "hf-eager"),  # tied lm_head: +6%
        ("llama3-8b", "hf-eager"),  # untied: the head is its own tensor
        ("mixtral-8x7b", "hf-eager"),
    ],
)
def test_adam_steps_each_parameter_once(model_id: str, framework: str) -> None:
    """The optimizer's kernels cover the model's parameters (`ModelSpec.num_params`, which
    counts a tied embedding once), not the head's tied weight a second time."""
    n = load_model(model_id).num_params()
    assert _adam_elements(model_id, framework) == -(-n // 65536) * 65536


def test_a_tied_head_still_adds_its_gradient_in() -> None:
    """Tying changes what the optimizer steps, not the backward: the head's weight gradient
    is still summed into the shared tensor (one add of the table)."""
    run = Workload(batch=1, seq=64, mode="train")
    acc = [op for op in build_ops(load_model("tiny-gpt"), run).ops if op.name == "head.lm_head.acc"]
    assert [op.kernel.dims for op in acc] == [(256, 1000)]


def test_megatron_tied_output_is_stepped_once() -> None:
    """Megatron's GPT shares the output layer with the token embedding: the optimizer steps
    the (V, H) table once, and the learned position table too: `ModelSpec.num_params`."""
    n = load_model("tiny-gpt").num_params()
    assert _adam_elements("tiny-gpt", "megatron") == -(-n // 65536) * 65536


def test_unfused_megatron_attention_keeps_the_score_matrix() -> None:
    """Korthikanti's ``5as/h`` term is there whenever the ``S x S`` scores are materialised:
    Megatron without flash attention keeps what hf-eager keeps (it was dropped for every
    ``megatron`` run)."""
    model = load_model("gpt3-175b")
    base = {"batch": 1, "seq": 2048, "mode": "train", "dtype": "bf16"}
    hf = Workload(**base)
    unfused = Workload(**base, framework="megatron", attention="unfused")
    flash = Workload(**base, framework="megatron", attention="flash")
    s, b, h, a = 2048, 1, 12288, 96
    assert layer_activation_bytes(model, unfused) == layer_activation_bytes(model, hf)
    assert layer_activation_bytes(model, unfused) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert layer_activation_bytes(model, flash) == pytest.approx(s * b * h * 34)
    gpu = load_gpu("h100-sxm5-80gb")
    assert (
        estimate_memory(model, unfused, gpu).activations_bytes
        > estimate_memory(model, flash, gpu).activations_bytes
    )


def test_llama3_8b_training_memory_by_hand() -> None:
    """bf16 mixed precision: 2 + 2 + 12 bytes per parameter, plus 32 layers of
    ``s*b*h*(10 + 33 + 5as/h)`` (GQA: attention 4 + 4 kv/heads = 5; HF eager's SwiGLU keeps
    gate, SiLU(gate), up and their product, 4 x 2 x 14336/4096 = 28) and two bf16 logits
    tensors."""
    model = load_model("llama3-8b")
    run = Workload(batch=1, seq=2048, mode="train", dtype="bf16")
    mem = estimate_memory(model, run, load_gpu("h100-sxm5-80gb"))
    n, s, h, a = 8_030_261_248, 2048, 4096, 32
    acts = 32 * s * h * (43 + 5 * a * s / h) + 2 * s * 128256 * 2
    assert model.num_params() == n
    assert mem.total_bytes == pytest.approx(16 * n + acts)
    assert not mem.fits  # 150 GiB against 80 GB


def _write(tmp_path: Path, cfg: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_hf_activation_defaults_are_the_config_classes(tmp_path: Path) -> None:
    """Without ``activation_function`` transformers runs GPT-2 with gelu_new and OPT with
    ReLU (their config classes' defaults); they were read as plain GeLU."""
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 1000}
    assert load_model(_write(tmp_path, gpt2)).activation == "gelu_new"
    assert load_model(_write(tmp_path, gpt2 | {"activation_function": "gelu"})).activation == "gelu"
    opt = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 256, "ffn_dim": 1024,
           "num_attention_heads": 4, "vocab_size": 1000}  # fmt: skip
    assert load_model(_write(tmp_path, opt)).activation == "relu"


def test_mixtral_config_defaults_are_eight_experts_top_two(tmp_path: Path) -> None:
    """A Mixtral config without the expert keys is MixtralConfig's 8 experts, 2 per token
    (it was read as a dense Llama): Mixtral 8x7B's published 46.7B parameters."""
    cfg = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 32000}  # fmt: skip
    model = load_model(_write(tmp_path, cfg))
    assert (model.architecture, model.num_experts, model.experts_per_token) == ("mixtral", 8, 2)
    assert model.num_params() == load_model("mixtral-8x7b").num_params()


def test_llama_config_head_dim_is_read(tmp_path: Path) -> None:
    """``head_dim`` sets the attention width when it is not hidden / heads."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 128, "vocab_size": 1000}  # fmt: skip
    model = load_model(_write(tmp_path, cfg))
    assert model.dhead == 128
    # q, k, v, o: 256 x (4 + 2 + 2) x 128 + (4 x 128) x 256; gate, up, down: 3 x 256 x 512
    layer = 256 * 8 * 128 + 512 * 256 + 3 * 256 * 512 + 2 * 256
    assert model.num_params() == 2 * layer + 256 + 2 * 1000 * 256


SDPA_MODULE = """
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(256, 768), nn.Linear(256, 256)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, 4, 64).transpose(1, 2) for t in self.qkv(x).split(256, -1))
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


def build(batch, seq):
    return Attn(), (torch.randn(batch, seq, 256),)
"""


def test_sdpa_softmax_is_priced_as_a_softmax(tmp_path: Path) -> None:
    """On the meta device ``scaled_dot_product_attention`` runs its math path, whose softmax
    is ``aten._safe_softmax``: a softmax (forward and backward), not an unmapped copy."""
    from simulator.module_predict import trace_builder

    path = tmp_path / "sdpa.py"
    path.write_text(SDPA_MODULE)
    trace = trace_builder(f"{path}:build", Workload(batch=2, seq=128, mode="train"))
    assert "_safe_softmax" not in trace.unmapped
    softmax = [f for f in trace.blocks[0].ops if any(k.family.value == "softmax" for k in f.fw)]
    assert [f.fw[0].dims for f in softmax] == [(2 * 4 * 128, 128)]


@pytest.mark.parametrize("model_id", ["tiny-gpt", "llama3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
def test_more_work_is_never_faster_and_training_costs_more(model_id: str, framework: str) -> None:
    """Roofline prices (monotone per kernel): a larger batch or sequence never runs faster,
    a training step costs more than the inference pass, and the forward is about a third of
    the GEMM work (backward = two GEMMs per forward GEMM)."""
    model, gpu = load_model(model_id), load_gpu("a100-sxm4-80gb")
    prev: dict[str, float] = {}
    for batch, seq in [(1, 128), (2, 128), (2, 256), (4, 512)]:
        res = {
            mode: predict_run(
                model, gpu, Workload(batch=batch, seq=seq, mode=mode, framework=framework),
                ROOFLINE,
            )
            for mode in ("inf", "train")
        }  # fmt: skip
        assert res["train"].e2e_ms > res["inf"].e2e_ms
        assert res["train"].fw_ms == pytest.approx(res["inf"].fw_ms, rel=0.25)
        for mode, r in res.items():
            assert r.e2e_ms >= prev.get(mode, 0.0)
            prev[mode] = r.e2e_ms


class _UsesOne(torch.nn.Module):
    """Two linear layers, the second a side branch the forward does not run."""

    def __init__(self, used: torch.dtype, side: torch.dtype) -> None:
        super().__init__()
        self.used = torch.nn.Linear(64, 64).to(used)
        self.side = torch.nn.Linear(64, 64).to(side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("used", "side", "expected"),
    [(torch.float32, torch.bfloat16, Dtype.FP32), (torch.float16, torch.float32, Dtype.FP32),
     (torch.float16, torch.bfloat16, Dtype.BF16)],
)  # fmt: skip
def test_a_dtype_tie_among_parameters_is_settled_the_same_way_every_run(
    used: torch.dtype, side: torch.dtype, expected: Dtype
) -> None:
    """As many parameter tensors in two dtypes: the module's dtype is the first of them in
    `module_trace.DTYPES` (fp32, bf16, fp16), not whichever a set of torch dtypes listed first
    in this process (that order changes from process to process: ``predict --module`` gave
    two different answers for the same module)."""
    from simulator.module_trace import trace_module

    with torch.device("meta"):
        module = _UsesOne(used, side)
        x = torch.randn(2, 64, dtype=used)
    assert trace_module(module, (x,), train=True).dtype is expected
