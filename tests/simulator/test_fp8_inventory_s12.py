"""fp8 training's op inventory as Megatron-LM + TransformerEngine runs it (`inventory_megatron`).

* Only the GEMMs of TE's linear modules (QKV, projection, MLP, experts) run in fp8; norms,
  element-wise ops, embedding, attention, the MoE router, the output layer and OPT's
  projections stay bf16, and no non-GEMM kernel is fp8.
* With every fp8 dtype swapped for bf16 and TE's casts taken out, the fp8 inventory is the
  bf16 one, kernel for kernel, less the bias-gradient reductions that TE fuses into its
  cast-transpose; the bf16 inventory itself is `oprules.linear` for every linear.
* TE's casts, as bf16 ``copy`` kernels of the memory family, move the closed-form bytes of a
  ``rows x width`` operand: ``cast`` 3, ``cast_transpose`` 4, ``transpose`` 2 per element;
  a ``Linear`` casts (and transposes) its input forward, a ``LayerNormLinear`` does not (its
  norm writes fp8) but transposes its saved input backward; every one cast-transposes its
  output gradient backward.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from forecast.kernels import Dtype, KernelSpec, OpFamily
from simulator import oprules as r
from simulator.inventory_megatron import CAST_BYTES_PER_ELEMENT, decoder, fp8_cast, te_linear
from simulator.models import DEFAULT_DATA_DIR, ModelSpec, load_model
from simulator.opgraph import Block, Workload
from simulator.oprules import FrameworkOp
from simulator.parallel import RunConfig
from simulator.scenario import load_scenario, resolve
from simulator.stagecost import shard_kernels

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
TE_LINEARS = frozenset({"qkv", "proj", "fc1", "fc2", "fc_gate_up", "fc_down"})
NORM_FUSED = frozenset({"qkv", "fc1", "fc_gate_up"})  # Megatron's TELayerNormColumnParallelLinear
# catalog ids and NeuSight names: Llama (GQA, SwiGLU, RMSNorm), GPT-3 (biases), Mixtral (MoE),
# OPT (word_embed_proj_dim projections), BERT (encoder)
NEUSIGHT_MODELS = DEFAULT_DATA_DIR / "models"


def _neusight(name: str) -> object:
    """A NeuSight model config, skipped where ../shared is absent (a project-only clone)."""
    missing = not (NEUSIGHT_MODELS / f"{name}.json").is_file()
    reason = f"needs the NeuSight model config {NEUSIGHT_MODELS / name}.json"
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=reason))


MODELS = ("llama3-8b", "gpt3-175b", "mixtral-8x7b", _neusight("opt"), _neusight("bert_large"))


def _small(model_id: str) -> ModelSpec:
    m = load_model(model_id)
    return m.model_copy(update={"num_layers": 2})


def _run(dtype: str, *, mode: str = "train", attention: str = "flash") -> Workload:
    return Workload(
        batch=2,
        seq=64,
        mode=mode,  # type: ignore[arg-type]
        framework="megatron",
        dtype=Dtype(dtype),
        attention=attention,  # type: ignore[arg-type]
    )


def _ops(blocks: tuple[Block, ...]) -> list[tuple[str, FrameworkOp]]:
    return [(b.name, fop) for b in blocks for fop in b.ops]


def _kernels(fop: FrameworkOp) -> tuple[KernelSpec, ...]:
    return (*fop.fw, *fop.bw)


def _te(block: str, fop: FrameworkOp) -> bool:
    return block == "layer" and fop.name in TE_LINEARS


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("mode", ["train", "inf"])
@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_fp8_kernels_are_the_te_linears_gemms_only(
    model_id: str, mode: str, attention: str
) -> None:
    """Every fp8 kernel is a ``linear`` GEMM of a TE linear of the layer, and every GEMM of a
    TE linear is fp8; the router, the output layer, OPT's projections are bf16 GEMMs."""
    blocks = decoder(_small(model_id), _run("fp8", mode=mode, attention=attention))
    for block, fop in _ops(blocks):
        for k in _kernels(fop):
            if _te(block, fop) and k.family is OpFamily.LINEAR:
                assert k.dtype is Dtype.FP8, (block, fop.name, k)
            else:
                assert k.dtype is Dtype.BF16, (block, fop.name, k)
    names = {f.name for _, f in _ops(blocks)}
    assert "output" in names
    if model_id == "mixtral-8x7b":
        assert "router" in names
    if model_id == "opt":
        assert {"project_in", "project_out"} <= names


def _as_bf16(k: KernelSpec) -> KernelSpec:
    return replace(k, dtype=Dtype.BF16) if k.dtype is Dtype.FP8 else k


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("mode", ["train", "inf"])
def test_fp8_inventory_with_bf16_dtypes_and_no_casts_is_the_bf16_one(
    model_id: str, mode: str
) -> None:
    """Op for op: a non-TE op is the bf16 one; a TE linear's GEMMs, dtype swapped, are the
    bf16 linear's GEMMs, with the same parameters; its bf16 bias-gradient reduction is the
    only kernel fused away (into TE's cast_transpose_bgrad)."""
    m = _small(model_id)
    fp8 = _ops(decoder(m, _run("fp8", mode=mode)))
    bf16 = _ops(decoder(m, _run("bf16", mode=mode)))
    assert [(b, f.name) for b, f in fp8] == [(b, f.name) for b, f in bf16]
    for (block, f8), (_, f16) in zip(fp8, bf16, strict=True):
        if not _te(block, f8):
            assert f8 == f16
            continue
        assert f8.params == f16.params
        for side8, side16 in ((f8.fw, f16.fw), (f8.bw, f16.bw)):
            gemms8 = [_as_bf16(k) for k in side8 if k.family is OpFamily.LINEAR]
            assert gemms8 == [k for k in side16 if k.family is OpFamily.LINEAR]
        rest16 = [k for k in f16.bw if k.family is not OpFamily.LINEAR]
        n_out = f16.params[0][1]
        assert rest16 == ([r.linear("b", 2 * 64, (1, n_out), Dtype.BF16).bw[2]] if m.bias else [])


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fused_norm", [False, True])
def test_te_linear_outside_fp8_is_the_plain_linear(dtype: str, fused_norm: bool) -> None:
    """16- and 32-bit training keeps `oprules.linear` for TE's linears: no cast kernels."""
    dt = Dtype(dtype)
    got = te_linear("qkv", 512, (256, 768), dt, bias=True, fused_norm=fused_norm)
    assert got == r.linear("qkv", 512, (256, 768), dt, bias=True)


@pytest.mark.parametrize(("rows", "width"), [(4096, 8192), (128, 1280), (7, 12)])
@pytest.mark.parametrize("kind", sorted(CAST_BYTES_PER_ELEMENT))
def test_cast_kernel_bytes_closed_form(rows: int, width: int, kind: str) -> None:
    """A bf16 memory ``copy`` moving rows x width x {3, 4, 2} bytes (width a multiple of 4)."""
    k = fp8_cast(kind, rows, width)
    assert (k.family, k.dtype, k.op) == (OpFamily.MEMORY, Dtype.BF16, "copy")
    assert k.bytes() == rows * width * CAST_BYTES_PER_ELEMENT[kind]
    assert k.flops() == 0.0


def test_cast_kernel_rounds_bytes_up() -> None:
    """A width that is no multiple of 4 is rounded up by less than one bf16 copy element."""
    k = fp8_cast("cast", 10, 5)  # 15 bytes a row -> 4 columns of 4 bytes
    assert 10 * 5 * 3 <= k.bytes() < 10 * 5 * 3 + 10 * 4


def _casts(ks: tuple[KernelSpec, ...]) -> list[float]:
    return [k.bytes() for k in ks if k.family is OpFamily.MEMORY]


@pytest.mark.parametrize("bias", [False, True])
def test_te_linear_casts_per_module(bias: bool) -> None:
    """``Linear``: forward cast_transpose of its input (cast only in inference), backward
    cast_transpose of dy. ``LayerNormLinear``: no forward cast, backward cast_transpose of dy
    and transpose of its saved fp8 input. GEMMs first: fw[0], bw[0] dgrad, bw[1] wgrad."""
    rows, n_in, n_out = 512, 256, 1024
    fp8 = Dtype.FP8
    plain = te_linear("proj", rows, (n_in, n_out), fp8, bias=bias)
    fused = te_linear("qkv", rows, (n_in, n_out), fp8, bias=bias, fused_norm=True)
    infer = te_linear("proj", rows, (n_in, n_out), fp8, bias=bias, train=False)
    gemms = r.linear("x", rows, (n_in, n_out), fp8, bias=False)
    for op in (plain, fused, infer):
        assert op.fw[0] == gemms.fw[0]
        assert op.bw[:2] == gemms.bw
    assert _casts(plain.fw) == [4 * rows * n_in]
    assert _casts(infer.fw) == [3 * rows * n_in]
    assert _casts(fused.fw) == []
    assert _casts(plain.bw) == [4 * rows * n_out]
    assert _casts(fused.bw) == [4 * rows * n_out, 2 * rows * n_in]


def test_llama_layer_cast_bytes_closed_form() -> None:
    """One dense SwiGLU layer of T tokens, training: forward 4T(qd + F) (the projection's and
    fc_down's inputs), backward 4T(qkv + h + 2F + h) (every dy) + 2T(h + h) (the norm-fused
    linears' inputs), where qd = heads x head_dim and qkv = (heads + 2 kv) x head_dim."""
    m = _small("llama3-8b")
    run = _run("fp8")
    layer = next(b for b in decoder(m, run) if b.name == "layer")
    t, h, f = run.tokens, m.hidden_size, m.ffn_hidden_size
    qd, qkv = m.num_heads * m.dhead, (m.num_heads + 2 * m.kv_heads) * m.dhead
    fw = sum(sum(_casts(op.fw)) for op in layer.ops if op.name in TE_LINEARS)
    bw = sum(sum(_casts(op.bw)) for op in layer.ops if op.name in TE_LINEARS)
    assert fw == 4 * t * (qd + f)
    assert bw == 4 * t * (qkv + h + 2 * f + h) + 2 * t * (h + h)


def test_moe_router_bf16_and_experts_cast_their_own_input() -> None:
    """A MoE layer's norm is Megatron's separate TENorm (the router reads it in bf16): its
    experts' first linear is a plain TE linear that casts its input; a dense fc1 is fused."""
    blocks = decoder(_small("mixtral-8x7b"), _run("fp8"))
    layer = next(b for b in blocks if b.name == "layer")
    router = next(op for op in layer.ops if op.name == "router")
    assert {k.dtype for k in _kernels(router)} == {Dtype.BF16}
    gate_up = [op for op in layer.ops if op.name == "fc_gate_up"]
    assert gate_up and all(_casts(op.fw) for op in gate_up)
    dense = next(b for b in decoder(_small("llama3-8b"), _run("fp8")) if b.name == "layer")
    assert not _casts(next(op for op in dense.ops if op.name == "fc_gate_up").fw)


@pytest.mark.parametrize("sp", [False, True])
def test_shard_column_gemms_stay_the_fp8_gemms(sp: bool) -> None:
    """`stagecost` reads a column-parallel linear's dgrad and wgrad as ``bw[0]``, ``bw[1]``:
    still the fp8 GEMMs with the casts appended."""
    inputs = resolve(
        load_scenario(
            TINY,
            overrides=(
                "cluster.num_gpus=2",
                "training.global_batch_size=8",
                "training.dtype='fp8'",
                "cluster.gpu='h100-sxm5-80gb'",
            ),
        )
    )
    sk = shard_kernels(inputs, RunConfig(tp=2, micro_batch_size=1, sequence_parallel=sp))
    for group in (*sk.col_dgrad, *sk.col_wgrad):
        assert group
        assert {(k.family, k.dtype) for k, _ in group} == {(OpFamily.LINEAR, Dtype.FP8)}
    layer_fw = {k for k, _ in sk.layer_fw}
    assert {k.family for k in layer_fw if k.dtype is Dtype.FP8} == {OpFamily.LINEAR}


def test_fp8_logits_are_cast_from_bf16_and_the_weights_cast_once_a_step() -> None:
    """The output layer is no TE linear: its logits are bf16, cast to fp32 for the loss at 6
    bytes a logit each way (3 were counted, as if fp8). TE casts each weight to fp8 with its
    transpose once a step: 4 bytes a parameter more than bf16's optimizer traffic."""
    from simulator.optimizer_step import OPTIMIZER_BYTES_PER_PARAM

    def head(dtype: str) -> list[KernelSpec]:
        sets = ("cluster.gpu='h100-sxm5-80gb'", f"training.dtype='{dtype}'")
        inputs = resolve(load_scenario(TINY, overrides=sets))
        run = RunConfig(tp=1, pp=1, dp=0, micro_batch_size=1)
        return [k for k, _ in shard_kernels(inputs, run).head_fw if k.op == "copy"]

    assert head("fp8") == head("bf16")
    assert [k.dtype for k in head("fp8")] == [Dtype.BF16]
    extra = OPTIMIZER_BYTES_PER_PARAM[Dtype.FP8] - OPTIMIZER_BYTES_PER_PARAM[Dtype.BF16]
    assert extra == 4


@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_gradient_adds_are_bf16_like_every_non_gemm(tp: int) -> None:
    """The backward's gradient-accumulation adds (one per parameter tensor and micro-batch)
    add TE's bf16 weight gradients: bf16 kernels, the same as bf16 training's, in the
    distributed shard and in the single-GPU ops (they were fp8 adds, 3 bytes an element)."""
    from simulator.opgraph import build_ops

    def adds(dtype: str) -> list[KernelSpec]:
        sets = ("cluster.gpu='h100-sxm5-80gb'", f"training.dtype='{dtype}'")
        inputs = resolve(load_scenario(TINY, overrides=sets))
        sk = shard_kernels(inputs, RunConfig(tp=tp, pp=1, dp=0, micro_batch_size=1))
        return [k for k, _ in sk.layer_bw if k.op == "add"]

    assert adds("fp8") == adds("bf16")
    assert adds("fp8") and {k.dtype for k in adds("fp8")} == {Dtype.BF16}
    ops = build_ops(_small("gpt3-175b"), _run("fp8")).ops
    acc = [op.kernel for op in ops if op.name.endswith(".acc")]
    assert acc and {k.dtype for k in acc} == {Dtype.BF16}
    non_gemm = {op.kernel.dtype for op in ops if op.kernel.family is not OpFamily.LINEAR}
    assert Dtype.FP8 not in non_gemm


@pytest.mark.parametrize("model_id", ["llama3-8b", "gpt3-175b", "mixtral-8x7b"])
def test_one_gpu_fp8_training_holds_te_weight_caches_as_dist_memory_does(model_id: str) -> None:
    """`memory.estimate_memory` of a Megatron fp8 training step holds TE's fp8 copy of each
    GEMM weight and its transpose, 2 bytes a GEMM weight element over bf16's weights (as
    `dist_memory` counts them); not in inference, nor under hf-eager."""
    from forecast.gpus import load_gpu
    from simulator.memory import estimate_memory

    m, gpu = _small(model_id), load_gpu("h100-sxm5-80gb")
    h, qd, kvd = m.hidden_size, m.num_heads * m.dhead, m.kv_heads * m.dhead
    mlp = (3 if m.activation == "swiglu" else 2) * h * m.ffn_hidden_size
    per_layer = h * (qd + 2 * kvd) + qd * h + mlp * (m.num_experts if m.num_experts > 1 else 1)
    gemm = m.num_layers * per_layer

    def weights(dtype: str, mode: str = "train", framework: str = "megatron") -> float:
        run = _run(dtype, mode=mode).model_copy(update={"framework": framework})
        return estimate_memory(m, run, gpu).weights_bytes

    assert weights("fp8") - weights("bf16") == pytest.approx(2 * gemm)
    assert weights("fp8", framework="hf-eager") == weights("bf16", framework="hf-eager")
    # 1-byte GEMM weights; the table, head, norms and router stay bf16 (all were 1 byte)
    assert weights("fp8", mode="inf") == pytest.approx(weights("bf16", mode="inf") - gemm)
