"""Closed forms of models and op inventories: published parameter counts, Narayanan's training
FLOPs, 6N + attention for Llama, and which attention Megatron runs on which GPU."""

from __future__ import annotations

import pathlib

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import GEMM_FAMILIES, Dtype
from simulator.hf_config import from_hf_config
from simulator.models import ModelSpec, load_model
from simulator.opgraph import OpGraph, Phase, Workload, _param_shapes, build_ops, inventory

# published totals (papers, model cards, HF `num_parameters()`), to 0.5%
PUBLISHED = [
    ("gpt3-175b", 174.6e9),
    ("llama2-7b", 6.74e9),
    ("llama2-70b", 68.98e9),
    ("llama3-8b", 8.03e9),
    ("llama3-70b", 70.6e9),
    ("llama3-405b", 405.9e9),
    ("mixtral-8x7b", 46.7e9),
]


@pytest.mark.parametrize(("model_id", "published"), PUBLISHED)
def test_catalog_parameter_counts_match_published(model_id: str, published: float) -> None:
    assert load_model(model_id).num_params() == pytest.approx(published, rel=0.005)


def test_mixtral_active_parameters_per_token() -> None:
    """12.9B of Mixtral's 46.7B take part per token: the 6 experts a token skips drop out."""
    m = load_model("mixtral-8x7b")
    expert = 3 * m.hidden_size * m.ffn_hidden_size
    skipped = m.num_layers * (m.num_experts - m.experts_per_token) * expert
    assert m.num_params() - skipped == pytest.approx(12.9e9, rel=0.005)


def _gpt2(layers: int, h: int) -> ModelSpec:
    return ModelSpec(
        id="gpt2", architecture="gpt2", num_layers=layers, hidden_size=h,
        ffn_hidden_size=4 * h, num_heads=h // 64, vocab_size=50257, max_positions=1024,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "h", "hf_count"),
    [(12, 768, 124_439_808), (24, 1024, 354_823_168), (36, 1280, 774_030_080),
     (48, 1600, 1_557_611_200)],
)  # fmt: skip
def test_gpt2_sizes_match_hf_exactly(layers: int, h: int, hf_count: int) -> None:
    assert _gpt2(layers, h).num_params() == hf_count


OPT_350M = {
    "model_type": "opt", "num_hidden_layers": 24, "hidden_size": 1024, "ffn_dim": 4096,
    "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
    "word_embed_proj_dim": 512, "do_layer_norm_before": False,
}  # fmt: skip


def test_opt_350m_projects_its_embeddings() -> None:
    """OPT-350m's token table and head are 512 wide, projected to and from the 1024-wide
    layers (project_in, project_out): HF counts 331,196,416 parameters (it has no final layer
    norm, 2,048 we keep). The table was read as 1024 wide: 356.9M, 7.8% over."""
    m = from_hf_config(OPT_350M, "opt-350m", "opt-350m.json")
    assert m.num_params() == 331_196_416 + 2 * 1024
    run = Workload(batch=1, seq=64, mode="train")
    head = [op.kernel.dims for op in build_ops(m, run).ops if op.name == "head.lm_head"]
    assert head[0] == (1, 64, 512, 50272)  # forward (T, E) @ (E, V)


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
@pytest.mark.parametrize(
    "model",
    ["llama3-8b", "llama2-7b", "mixtral-8x7b", "gpt2_large", "opt_13", "opt", "OPT_350M"],
)
def test_inventory_owns_exactly_the_model_parameters(model: str, framework: str) -> None:
    """The optimizer steps what the inventory owns; it is `num_params` (Megatron's RMSNorm
    has no bias: it was counted with one, 2h per layer)."""
    m = from_hf_config(OPT_350M, "opt-350m", "x.json") if model == "OPT_350M" else _load(model)
    run = Workload(batch=1, seq=64, mode="train", framework=framework, dtype=Dtype.BF16)
    owned = sum(r * a * b for (a, b), r in _param_shapes(inventory(m, run)))
    assert owned == m.num_params()


def _load(model: str) -> ModelSpec:
    """A catalog model, or a NeuSight config read from ../shared (skipped where absent)."""
    from simulator.models import CATALOG_DIR, DEFAULT_DATA_DIR

    folder = DEFAULT_DATA_DIR / "models"
    if not (CATALOG_DIR / f"{model}.toml").is_file() and not (folder / f"{model}.json").is_file():
        pytest.skip(f"NeuSight model config {model}.json not present in {folder}")
    return load_model(model)


def _gemm_flops(graph: OpGraph) -> dict[Phase, float]:
    out = dict.fromkeys(Phase, 0.0)
    for op in graph.ops:
        if op.kernel.family in GEMM_FAMILIES:
            b, m, n, k = op.kernel.dims
            out[op.phase] += 2.0 * b * m * n * k * op.count
    return out


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
@pytest.mark.parametrize(("model_id", "batch", "seq"), [("tiny-gpt", 2, 128), ("gpt2_med", 2, 512)])
def test_gpt_training_flops_are_narayanans(
    model_id: str, batch: int, seq: int, framework: str
) -> None:
    """72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per step (Narayanan et al. 2021), backward
    twice forward for every GEMM (unfused attention: no recomputed QK^T)."""
    m = _load(model_id)
    run = Workload(batch=batch, seq=seq, framework=framework, dtype=Dtype.FP16, attention="unfused")
    f = _gemm_flops(build_ops(m, run))
    layers, h, v = m.num_layers, m.hidden_size, m.vocab_size
    step = 72 * batch * seq * layers * h * h * (1 + seq / (6 * h) + v / (12 * layers * h))
    assert f[Phase.FORWARD] + f[Phase.BACKWARD] == pytest.approx(step, rel=1e-12)
    assert f[Phase.BACKWARD] == pytest.approx(2 * f[Phase.FORWARD], rel=1e-12)


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
@pytest.mark.parametrize("model_id", ["llama3-8b", "mixtral-8x7b"])
def test_llama_forward_flops_are_2n_plus_attention(model_id: str, framework: str) -> None:
    """GQA (K, V projections kv_heads wide) and SwiGLU (three matrices), top-k experts:
    forward = 2 N_active T + 4 l B s^2 (heads x d); training = 3x forward."""
    m = load_model(model_id)
    b, s = 1, 256
    h, qd, kvd = m.hidden_size, m.num_heads * m.dhead, m.kv_heads * m.dhead
    router = h * m.num_experts if m.num_experts > 1 else 0
    layer = h * (qd + 2 * kvd) + qd * h + 3 * h * m.ffn_hidden_size * m.experts_per_token
    n_active = m.num_layers * (layer + router) + h * m.vocab_size
    run = Workload(batch=b, seq=s, framework=framework, dtype=Dtype.BF16, attention="unfused")
    f = _gemm_flops(build_ops(m, run))
    assert f[Phase.FORWARD] == pytest.approx(
        2 * n_active * b * s + 4 * m.num_layers * b * s * s * qd, rel=1e-12
    )
    assert f[Phase.BACKWARD] == pytest.approx(2 * f[Phase.FORWARD], rel=1e-12)


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
def test_inference_has_no_backward_or_optimizer(framework: str) -> None:
    run = Workload(batch=1, seq=64, mode="inf", framework=framework, dtype=Dtype.BF16)
    graph = build_ops(load_model("llama3-8b"), run)
    assert {op.phase for op in graph.ops} == {Phase.FORWARD}


def test_megatron_fp32_defaults_to_unfused_attention() -> None:
    """FlashAttention has no fp32 kernels: a megatron fp32 run left to its default runs
    CoreAttention, as a scenario's ``attention = "auto"`` (it ran flash)."""
    base = {"batch": 1, "seq": 64, "framework": "megatron"}
    assert Workload(**base).attention == "unfused"
    assert Workload(**base, dtype=Dtype.TF32).attention == "unfused"
    assert Workload(**base, dtype=Dtype.BF16).attention == "flash"
    assert Workload(**base, dtype=Dtype.FP32, attention="flash").attention == "flash"


@pytest.mark.parametrize(
    ("gpu", "flash"),
    [("v100-pcie-32gb", False), ("t4", False), ("p100-pcie-16gb", False), ("p4", False),
     ("mi100", False), ("a100-pcie-40gb", True), ("l4", True), ("h100-sxm5-80gb", True),
     ("b200-hgx-180gb", True), ("mi210", True), ("mi300x", True)],
)  # fmt: skip
def test_flash_attention_needs_sm80_or_cdna2(gpu: str, flash: bool) -> None:
    from forecast.flash_attention import has_flash_attention

    assert has_flash_attention(load_gpu(gpu)) is flash


def test_megatron_on_a_v100_runs_core_attention() -> None:
    """FlashAttention-2 needs sm80+: Megatron-LM on a V100 runs CoreAttention with the fused
    scale-mask-softmax kernel over the ``b a s s`` scores."""
    from simulator.opgraph import on_gpu

    run = Workload(batch=2, seq=128, framework="megatron", dtype=Dtype.FP16)
    assert run.attention == "flash"
    v100 = on_gpu(run, load_gpu("v100-pcie-32gb"))
    assert v100.attention == "unfused"
    names = {op.name for op in build_ops(load_model("tiny-gpt"), v100).ops}
    assert "layer.softmax" in names
    assert "layer.flash_attention" not in names
    assert on_gpu(run, load_gpu("a100-pcie-40gb")) == run
    hf = Workload(batch=2, seq=128, dtype=Dtype.FP16)
    assert on_gpu(hf, load_gpu("v100-pcie-32gb")) == hf


def test_predict_and_scenarios_fall_back_to_core_attention_below_sm80() -> None:
    """The whole-model forecast and a scenario's ``attention = "auto"`` run Megatron's
    unfused attention on a V100; an explicit ``flash`` there is one line naming the key."""
    from forecast.roofline import RooflineModel
    from simulator.e2e import predict_run
    from simulator.errors import ConfigError
    from simulator.scenario import load_scenario, resolve

    model, v100 = load_model("tiny-gpt"), load_gpu("v100-pcie-32gb")
    run = Workload(batch=2, seq=128, mode="train", framework="megatron", dtype=Dtype.FP16)
    unfused = run.model_copy(update={"attention": "unfused"})
    got = predict_run(model, v100, run, RooflineModel())
    assert got == predict_run(model, v100, unfused, RooflineModel())
    assert got.by_family_ms["softmax"] > 0
    tiny = pathlib.Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"
    # fp16: a V100 has no bf16 rate (the scenario's bf16 is refused there, naming the key)
    sets = ["cluster.gpu='v100-sxm2-32gb'", "cluster.server='dgx1-v100'", "training.dtype='fp16'"]
    assert resolve(load_scenario(tiny, overrides=sets)).attention == "unfused"
    with pytest.raises(ConfigError, match=r"^training\.attention: flash, but FlashAttention-2"):
        resolve(load_scenario(tiny, overrides=[*sets, "training.attention='flash'"]))


@pytest.mark.parametrize("pp", [1, 2])
def test_distributed_stages_hold_opts_projected_tables(pp: int) -> None:
    """The distributed simulator's stages of OPT-350m hold its 512-wide table, both
    projections and the final norm (tp 1: the stages add up to the model's parameters, the
    tied table counted once at pp 1 and on both ends at pp 2), and its head FLOPs are those
    of the 512-wide head."""
    from simulator.parallel import RunConfig
    from simulator.results import forward_flops_per_token
    from simulator.shard_params import chunk_params

    m = from_hf_config(OPT_350M, "opt-350m", "x.json")
    run = RunConfig(tp=1, pp=pp, dp=1, micro_batch_size=1)
    layers = m.num_layers // pp
    held = sum(chunk_params(m, run, layers, first=s == 0, last=s == pp - 1) for s in range(pp))
    copy = m.vocab_size * m.embed_width if pp > 1 else 0  # the tied table on the last stage
    assert held == m.num_params() + copy
    e, h = m.embed_width, m.hidden_size
    assert forward_flops_per_token(m, 2048)[2] == 2.0 * e * m.vocab_size + 4.0 * e * h
