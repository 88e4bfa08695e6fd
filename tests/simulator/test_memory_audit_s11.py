"""Audit of the per-GPU memory and the TP collectives' bytes for low-precision training.

Closed forms, worked by hand:

* Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
  eq. 2): a layer keeps ``s*b*h*(34 + 5as/h)`` bytes in 16-bit, ``10 + 24/t`` (+ scores) with
  TP, ``34/t`` with TP + SP; of the 10: the two norms' inputs (4), two dropout masks (2), the
  QKV and fc1 inputs (2 + 2); of the 24: Q, K, V and the projection's input (8), GeLU's input
  and fc2's input (8 + 8).
* fp8 training with TransformerEngine (Megatron-core's TE layer spec): only the GEMMs run in
  fp8. Each TE linear casts its input to fp8 and saves that fp8 copy for its weight gradient
  (transformer_engine/pytorch/module/layernorm_linear.py `_LayerNormLinear.forward`: ``ln_out``
  is uint8 under fp8 and is what ``save_for_backward`` keeps; linear.py `_Linear.forward` the
  same for ``inputmat``); everything else stays bf16: the norms' inputs, the residual stream,
  Q/K/V and the output FlashAttention saves (TE's DotProductAttention in bf16 by default),
  GeLU/SwiGLU's input (Megatron's fused bias_gelu / bias_swiglu, torch ops). So per token of
  a GPT layer (MHA, ffn = 4h, flash): 2 norm inputs 4 + masks 2 + QKV/fc1 fp8 inputs 1 + 1 =
  8 replicated, and Q, K, V 6 + attention output 2 (bf16, FlashAttention's) + its fp8 copy 1 +
  GeLU input 8 + fc2's fp8 input 4 = 21 split by TP: 29, not 34 / 2 = 17.
* Megatron's TP collectives move the bf16 hidden states (the row-parallel GEMM outputs that are
  all-reduced or reduce-scattered are bf16); under sequence parallelism TE quantizes before it
  all-gathers a column-parallel linear's input (layernorm_linear.py: ``gather_along_first_dim``
  of the uint8 ``ln_out``) and a row-parallel linear's output gradient (module/base.py
  `grad_output_preprocess`: ``gather_along_first_dim(grad_output, ..., quantizer=...)``), so
  those all-gathers move 1 byte an element; Megatron's own gathers (the output layer's input,
  the embedding's backward, the PP hop, MoE dispatch) stay bf16.
* Megatron-LM trains fp8 on top of ``--bf16``, which forces ``accumulate_allreduce_grads_in_fp32``
  (megatron/training/arguments.py): fp32 main gradients, 4 bytes, reduced over DP in fp32.
* Parameters per GPU (Megatron's ColumnParallelLinear / RowParallelLinear): column-parallel
  weights and biases and row-parallel weights are split over tp; row-parallel biases and the
  norms' weights are whole on every TP rank (`ModelSpec.layer_param_tensors`).
* HF eager ``LlamaMLP``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` saves x (once, for
  both linears), the gate output (SiLU's input), SiLU's output and up's output (the multiply's
  two inputs) and their product (down_proj's input): 4 tensors of ffn width beyond x.
  Megatron's fused bias_swiglu saves gate and up concatenated and recomputes SiLU: 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.kernels import Dtype
from simulator.comm import activation_bytes, collective_s, layer_comm
from simulator.dist_memory import layer_activation_bytes, stage_memory
from simulator.dp_comm import dp_grad_s
from simulator.memory import layer_activation_bytes as gpu_layer_activation_bytes
from simulator.memory import parallel_units
from simulator.models import load_model
from simulator.opgraph import Workload
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.shard_params import chunk_params, moe_layer_params
from simulator.simulate import layout_of, peak_memory
from simulator.stepcosts import stage_params

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
S, H, A, V = 128, 256, 8, 1024  # the tiny GPT: MHA, ffn = 4h, LayerNorm, biases


def _tiny(gpus: int, dtype: str, *sets: str) -> SimInputs:
    base = (
        "model.n_layers=8",
        f"cluster.num_gpus={gpus}",
        "training.global_batch_size=32",
        f"training.dtype='{dtype}'",
        "cluster.gpu='h100-sxm5-80gb'",
    )
    return resolve(load_scenario(TINY, overrides=(*base, *sets)))


# --- 1. fp8 training: activations and TP collectives -------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_fp8_layer_keeps_bf16_activations_and_fp8_gemm_inputs(
    tp: int, sp: bool, recompute: str
) -> None:
    """Flash attention: 8 replicated + 21 split bytes per token-h (module docstring); full
    recompute keeps the bf16 layer input, 2 bytes (it counted 17 and 1)."""
    inputs = _tiny(tp, "fp8")
    assert inputs.attention == "flash"
    run = RunConfig(tp=tp, micro_batch_size=2, sequence_parallel=sp, recompute=recompute)  # type: ignore[arg-type]
    sbh = S * 2 * H
    if recompute == "full":
        want = 2 * sbh / (tp if sp else 1)
    elif sp:
        want = sbh * 29 / tp
    else:
        want = sbh * (8 + 21 / tp)
    assert layer_activation_bytes(inputs, layout_of(inputs, run)) == pytest.approx(want, rel=1e-12)


def test_fp8_unfused_attention_keeps_bf16_scores_and_only_the_fp8_projection_input() -> None:
    """Unfused core attention (TE's UnfusedDotProductAttention, bf16): softmax output, dropout
    mask and output, 5as/h bytes; the AV bmm keeps no output, so the projection's input is
    only its fp8 copy: 8 + (2 + 2 + 2 + 1 + 8 + 4 + 5as/h) / t."""
    tp = 2
    inputs = _tiny(tp, "fp8", "training.attention='unfused'")
    run = RunConfig(tp=tp, micro_batch_size=2, recompute="none")
    want = S * 2 * H * (8 + (19 + 5 * A * S / H) / tp)
    assert layer_activation_bytes(inputs, layout_of(inputs, run)) == pytest.approx(want, rel=1e-12)


def test_bf16_layer_is_still_korthikanti() -> None:
    """The fp8 rules leave 16-bit training at eq. 2: 10 + 24/t."""
    inputs = _tiny(2, "bf16")
    run = RunConfig(tp=2, micro_batch_size=2, recompute="selective")
    want = S * 2 * H * (10 + 24 / 2)
    assert layer_activation_bytes(inputs, layout_of(inputs, run)) == pytest.approx(want, rel=1e-12)


def test_fp8_single_gpu_megatron_layer_is_29_bytes_a_token() -> None:
    """One GPU (`memory.layer_activation_bytes`), Megatron fp8 with flash attention: 8 + 21
    bytes per token-h for GPT-3's MHA, ffn = 4h layer (it counted 34 / 2 = 17)."""
    m = load_model("gpt3-175b")
    s, b = 2048, 1
    run = Workload(batch=b, seq=s, framework="megatron", dtype="fp8", attention="flash")
    assert gpu_layer_activation_bytes(m, run) == pytest.approx(s * b * m.hidden_size * 29)


@pytest.mark.parametrize("tp", [2, 8])
def test_fp8_tp_collectives_move_bf16_except_te_input_gathers(tp: int) -> None:
    """A = tokens x h x 2 bytes under fp8 (bf16 hidden states); with SP the layer's all-gathers
    are TE's quantized gathers (A / 2) and its reduce-scatters bf16 (A); without SP the
    all-reduces are bf16. The output layer's input gather (Megatron's own) moves A."""
    fp8, bf16 = _tiny(tp, "fp8"), _tiny(tp, "bf16")
    for sp in (False, True):
        run = RunConfig(tp=tp, micro_batch_size=2, sequence_parallel=sp)
        lay8, lay16 = layout_of(fp8, run), layout_of(bf16, run)
        a = 2 * S * H * 2.0
        assert activation_bytes(fp8, lay8) == a
        c8, c16 = layer_comm(fp8, lay8), layer_comm(bf16, lay16)
        g, cl = lay8.tp_group, fp8.cluster
        if sp:
            assert c8.tp_rs_s == pytest.approx(collective_s("reduce-scatter", a, g, cl))
            assert c8.tp_rs_s == pytest.approx(c16.tp_rs_s)
            assert c8.tp_ag_s == pytest.approx(collective_s("all-gather", a / 2, g, cl))
            assert c8.tp_head_fw_s == pytest.approx(collective_s("all-gather", a, g, cl))
            assert c8.tp_embed_bw_s == pytest.approx(c16.tp_embed_bw_s)
            # forward: per linear pair a TE fp8 gather and a bf16 reduce-scatter
            assert c8.tp_fw_s == pytest.approx(2 * (c8.tp_ag_s + c8.tp_rs_s))
        else:
            assert c8.tp_ar_s == pytest.approx(collective_s("all-reduce", a, g, cl))
            assert c8.tp_ar_s == pytest.approx(c16.tp_ar_s)
            assert c8.tp_fw_s == pytest.approx(c16.tp_fw_s)


def test_fp8_pp_and_cp_traffic_is_bf16() -> None:
    """The PP send and the CP ring's K and V carry bf16 tensors under fp8 (attention runs in
    bf16): the same seconds as a bf16 run of the same layout."""
    for sets, run in (
        ((), RunConfig(tp=2, pp=2, micro_batch_size=2)),
        (("model.seq_len=512",), RunConfig(tp=2, cp=2, micro_batch_size=2)),
    ):
        fp8, bf16 = _tiny(4, "fp8", *sets), _tiny(4, "bf16", *sets)
        c8, c16 = layer_comm(fp8, layout_of(fp8, run)), layer_comm(bf16, layout_of(bf16, run))
        assert (c8.pp_hop_s, c8.cp_kv_s, c8.cp_kv_grad_s) == pytest.approx(
            (c16.pp_hop_s, c16.cp_kv_s, c16.cp_kv_grad_s)
        )


def test_fp8_keeps_fp32_main_grads_and_reduces_them_in_fp32() -> None:
    """Megatron's fp8 runs on --bf16: 2 B weights + 4 B fp32 main grads + 12 B Adam state
    (6 + 12/d with the distributed optimizer), plus TE's cached fp8 weight and its transpose
    (1 + 1 B per GEMM weight element); the DP gradient reduction moves 4 B a parameter, as
    bf16's does (it kept and reduced 2 B grads)."""
    fp8, bf16 = _tiny(4, "fp8"), _tiny(4, "bf16")
    run = RunConfig(dp=4, zero_stage=0, distributed_optimizer=True)
    lay8, lay16 = layout_of(fp8, run), layout_of(bf16, run)
    n = stage_params(fp8, lay8)[0]
    mem = peak_memory(fp8, lay8)
    assert mem.gradients_bytes == pytest.approx(4 * n, rel=1e-12)
    assert mem.optimizer_bytes == pytest.approx(12 * n / 4, rel=1e-12)
    gemm = 8 * 12 * H * H  # 8 layers of QKV, projection, fc1, fc2 weights (tp 1)
    assert mem.weights_bytes == pytest.approx(2 * n + 2 * gemm, rel=1e-12)
    assert peak_memory(bf16, lay16).weights_bytes == pytest.approx(2 * n, rel=1e-12)
    assert dp_grad_s(n, fp8, lay8) == pytest.approx(dp_grad_s(n, bf16, lay16))


# --- 2. parameters per GPU under TP -----------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpt3_layer_per_rank_keeps_norms_and_row_biases_whole(tp: int) -> None:
    """GPT-3 175B, one layer on one of tp ranks: 12 h^2 / t weights, the column-parallel
    biases 3h + 4h over t, the row-parallel biases (h + h) and the two LayerNorms (4h) whole
    (it divided all 12 h^2 + 13 h by t)."""
    m = load_model("gpt3-175b")
    h = m.hidden_size
    want = 12 * h * h // tp + 7 * h // tp + 2 * h + 4 * h
    got = chunk_params(m, RunConfig(tp=tp), 1, first=False, last=False)
    assert got == want == sum(m.layer_param_tensors(moe=False, tp=tp))


def test_llama_stage_params_under_tp_keep_rmsnorms_whole() -> None:
    """Llama 3 70B, tp 8 pp 4 (20 layers a stage): each layer's two RMSNorm weights (2h) are
    whole on every rank; the first stage adds the vocab-parallel embedding V h / 8, the last
    the final RMSNorm (h, whole) and the untied vocab-parallel head V h / 8."""
    inputs = resolve(load_scenario(ROOT / "scenarios" / "llama3_70b_h100.toml"))
    m, run = inputs.model, RunConfig(tp=8, pp=4, micro_batch_size=1)
    h, f, kv = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.dhead
    layer = (h * (h + 2 * kv) + h * h + 3 * h * f) // 8 + 2 * h
    table = m.vocab_size * h / 8
    got = stage_params(inputs, layout_of(inputs, run))
    assert got == pytest.approx(
        [20 * layer + table, 20 * layer, 20 * layer, 20 * layer + h + table]
    )


def test_moe_layer_shared_part_keeps_norms_whole() -> None:
    """Mixtral 8x7B at tp 2: attention over tp, the two RMSNorms (2h) and the router (8h)
    whole, 8 experts of 3 h f over tp (it divided the norms by tp)."""
    m = load_model("mixtral-8x7b")
    h, f, kv = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.dhead
    want = (h * (h + 2 * kv) + h * h) / 2 + 2 * h + 8 * h + 8 * 3 * h * f / 2
    assert moe_layer_params(m, RunConfig(tp=2)) == pytest.approx(want, rel=1e-15)


def test_zero3_gathers_two_per_rank_layers() -> None:
    """ZeRO-3 over dp 4 at tp 2: one GPU holds its 1/4 share plus two whole per-rank layers
    (each 12 h^2/2 + 7h/2 + 6h, larger than the V h / 2 embedding table), 2 B each."""
    inputs = _tiny(8, "bf16")
    lay = layout_of(inputs, RunConfig(tp=2, dp=4, zero_stage=3))
    n = stage_params(inputs, lay)[0]
    layer = 12 * H * H // 2 + 7 * H // 2 + 6 * H
    assert layer > V * H / 2
    mem = peak_memory(inputs, lay)
    assert mem.weights_bytes == pytest.approx(2 * (n / 4 + 2 * layer), rel=1e-12)


# --- 3. HF eager SwiGLU ------------------------------------------------------------------


def test_hf_eager_swiglu_saves_four_ffn_wide_tensors() -> None:
    """HF eager LlamaMLP keeps gate, SiLU(gate), up and their product: 4 x 2 f/h units, one
    tensor more than Megatron's fused SwiGLU (3 x 2 f/h)."""
    m = load_model("llama3-8b")
    h, f = m.hidden_size, m.ffn_hidden_size
    attention = 2 * (2 + 2 * 8 / 32)  # Q + projection input, K + V at 8 of 32 heads
    assert parallel_units(m) == pytest.approx(attention + 6 * f / h, rel=1e-12)
    assert parallel_units(m, "hf-eager") == pytest.approx(attention + 8 * f / h, rel=1e-12)
    s, b = 1024, 1
    run = Workload(batch=b, seq=s, framework="hf-eager", dtype="bf16")
    scores = 5 * m.num_heads * s / h
    want = s * b * h * (10 + attention + 8 * f / h + scores)
    assert gpu_layer_activation_bytes(m, run) == pytest.approx(want, rel=1e-12)


# --- 4. model state per ZeRO stage ---------------------------------------------------------


@pytest.mark.parametrize(
    ("zero", "dist_opt", "grads", "optim"),
    [
        (0, False, 4, 12),  # Megatron, no sharding: 2 + 4 + 12 = 18 B
        (0, True, 4, 12 / 4),  # distributed optimizer: 6 + 12/d
        (1, False, 4, 12 / 4),  # ZeRO-1: the same
        (2, False, 4 / 4, 12 / 4),  # ZeRO-2: 2 + 16/d
    ],
)
def test_bf16_model_state_per_zero_stage(
    zero: int, dist_opt: bool, grads: float, optim: float
) -> None:
    """Megatron-LM docs (distributed optimizer): bf16 params, fp32 grads: 18 B, 6 + 12/d."""
    inputs = _tiny(4, "bf16")
    lay = layout_of(inputs, RunConfig(dp=4, zero_stage=zero, distributed_optimizer=dist_opt))
    n = stage_params(inputs, lay)[0]
    mem = stage_memory(inputs, lay, 0, n, 1)
    assert (mem.weights_bytes, mem.gradients_bytes, mem.optimizer_bytes) == pytest.approx(
        (2 * n, grads * n, optim * n), rel=1e-12
    )


def test_fp8_dtype_reaches_memory_as_fp8() -> None:
    """Guard: the scenario's fp8 is the Dtype the rules above key on."""
    assert _tiny(1, "fp8").dtype is Dtype.FP8
