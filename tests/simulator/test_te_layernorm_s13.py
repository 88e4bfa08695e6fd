"""The layer norm in front of TransformerEngine's ``LayerNormLinear`` under fp8 training.

TE fuses the norm with the fp8 quantisation of the GEMM's input: the norm kernel reads the
bf16 hidden states and writes the normalised output in fp8 (1 byte an element; the bf16 copy
is kept only when the module must return it, which Megatron's ``LayerNormLinear`` does not),
and no separate cast kernel runs for that input. In Megatron-core's dense layer two norms feed
one: the attention's input norm (QKV) and the MLP's (fc1); a MoE layer's norm is a separate
``TENorm`` that the router reads in bf16, and the final norm feeds the bf16 output layer.

* No double count: nothing casts that input, and the norm and its ``LayerNormLinear`` move,
  forward, only the norm's bytes and the GEMM's, in every decoder stack and mode.
* Not modelled: the fused kernel writes ``T h`` bytes (fp8), the model prices the write at
  2 bytes an element (the norm as bf16 training's, which `test_fp8_inventory_s12` keeps
  equal); pricing it at 1 byte moved Llama 3 70B's fp8 step by 0.06%.
* Every other path (bf16, fp16, fp32, the final and the MoE norms) keeps
  `oprules.layernorm`'s kernels (HF eager has its own inventory, `inventory_hf`).
"""

from __future__ import annotations

import pytest

from forecast.kernels import Dtype, KernelSpec, OpFamily
from simulator import oprules as r
from simulator.inventory_megatron import decoder
from simulator.models import ModelSpec, load_model
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp

# norm -> the TE LayerNormLinear it feeds in a dense layer (Megatron-core's
# TELayerNormColumnParallelLinear)
FEEDS = {"input_norm": "qkv", "post_norm": "fc1"}
SWIGLU_FEEDS = {"input_norm": "qkv", "post_norm": "fc_gate_up"}
B, S = 2, 64
T = B * S


def _model(model_id: str) -> ModelSpec:
    return load_model(model_id).model_copy(update={"num_layers": 2})


def _layer(m: ModelSpec, dtype: str, *, mode: str = "train") -> Block:
    run = Workload(batch=B, seq=S, mode=mode, framework="megatron", dtype=Dtype(dtype))  # type: ignore[arg-type]
    return next(b for b in decoder(m, run) if b.name == "layer")


def _op(block: Block, name: str) -> FrameworkOp:
    return next(op for op in block.ops if op.name == name)


def _feeds(m: ModelSpec) -> dict[str, str]:
    return SWIGLU_FEEDS if m.activation == "swiglu" else FEEDS


def _norm_bytes(h: int, dtype: Dtype) -> float:
    """`oprules.layernorm`'s forward over ``(T, h)``: x read, y written, weight and bias."""
    return KernelSpec(OpFamily.LAYERNORM, (T, h), dtype).bytes()


@pytest.mark.parametrize("model_id", ["llama3-8b", "gpt3-175b"])
@pytest.mark.parametrize("mode", ["train", "inf"])
def test_no_cast_kernel_on_the_norm_fused_gemm_input(model_id: str, mode: str) -> None:
    """fp8: the norm's forward is its one norm kernel, its LayerNormLinear's forward the fp8
    GEMM alone; together they move the norm's bytes and the GEMM's, no cast's 3 bytes an
    element (nor a bf16 round trip) on top."""
    m = _model(model_id)
    layer = _layer(m, "fp8", mode=mode)
    h = m.hidden_size
    for norm_name, linear_name in _feeds(m).items():
        norm, linear = _op(layer, norm_name), _op(layer, linear_name)
        assert [k.family for k in norm.fw] == [OpFamily.LAYERNORM], norm_name
        assert [(k.family, k.dtype) for k in linear.fw] == [(OpFamily.LINEAR, Dtype.FP8)]
        gemm = linear.fw[0]
        assert gemm.dims[:3] == (1, T, h)  # reads the norm's (T, h) output
        moved = sum(k.bytes() for k in (*norm.fw, *linear.fw))
        assert moved <= _norm_bytes(h, Dtype.BF16) + gemm.bytes()


def test_the_norms_feeding_no_layernorm_linear_stay_bf16() -> None:
    """A MoE layer's norm (the router reads it) and the final norm (the bf16 output layer)
    are `oprules.layernorm`'s bf16 kernels; the experts' fc1 casts its own input."""
    mixtral = _model("mixtral-8x7b")
    layer = _layer(mixtral, "fp8")
    h = mixtral.hidden_size
    want = r.layernorm("post_norm", T, h, Dtype.BF16)
    assert _op(layer, "post_norm").fw == want.fw
    assert _op(layer, "post_norm").bw == want.bw
    assert any(k.family is OpFamily.MEMORY for k in _op(layer, "fc_gate_up").fw)
    run = Workload(batch=B, seq=S, framework="megatron", dtype=Dtype.FP8)
    llama = _model("llama3-8b")
    head = next(b for b in decoder(llama, run) if b.name == "head")
    final = _op(head, "final_norm")
    assert final.fw == r.layernorm("final_norm", T, llama.hidden_size, Dtype.BF16).fw


@pytest.mark.parametrize("model_id", ["llama3-8b", "gpt3-175b"])
def test_fp8_norm_backward_keeps_bf16_gradients(model_id: str) -> None:
    """The backward of a norm that feeds a LayerNormLinear is bf16 training's: ``x``, ``dy``
    -> ``dx`` over 1.5 T rows and the weight-gradient reduction, in bf16."""
    m = _model(model_id)
    fp8, bf16 = _layer(m, "fp8"), _layer(m, "bf16")
    for norm_name in _feeds(m):
        assert _op(fp8, norm_name).bw == _op(bf16, norm_name).bw
        assert _op(fp8, norm_name).params == _op(bf16, norm_name).params
        assert {k.dtype for k in _op(fp8, norm_name).bw} == {Dtype.BF16}


@pytest.mark.parametrize("model_id", ["llama3-8b", "gpt3-175b"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_16_and_32_bit_norms_are_the_layernorm_rule(model_id: str, dtype: str) -> None:
    """Outside fp8 every norm of the Megatron layer is `oprules.layernorm` in the workload's
    dtype (read and write at its itemsize; RMSNorm without the bias parameter)."""
    m = _model(model_id)
    dt = Dtype(dtype)
    layer = _layer(m, dtype)
    for norm_name in _feeds(m):
        want = r.layernorm(norm_name, T, m.hidden_size, dt)
        got = _op(layer, norm_name)
        assert (got.fw, got.bw) == (want.fw, want.bw)
        assert got.fw[0].bytes() == _norm_bytes(m.hidden_size, dt)
