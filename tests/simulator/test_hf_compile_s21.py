"""``framework = "hf-compile"``: an HF model's inference pass under ``torch.compile``.

The GEMMs stay the eager ones (Inductor calls cuBLAS); every run of other kernels between two
GEMMs becomes one kernel (`simulator.inventory_compile`). Checked: the same GEMMs, the fused
kernels' count and bytes in closed form, the refusals, and the ``-fusion`` labels read apart
from the eager ones.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import GEMM_FAMILIES, KernelSpec, OpFamily
from forecast.predict import load_latency_model
from simulator.cli import main
from simulator.e2e import predict_run
from simulator.e2e_tables import COMPILE_BEGIN, COMPILE_END, E2E_MARKERS, compiled_rows
from simulator.e2e_validate import load_labels, prepare
from simulator.errors import ConfigError
from simulator.models import ModelSpec, load_model
from simulator.opgraph import Framework, OpGraph, Phase, Workload, build_ops
from tests.support import SMALL_GPT2

GPT2 = SMALL_GPT2
H, F = GPT2.hidden_size, GPT2.ffn_hidden_size


def _graph(model: ModelSpec, framework: str, **kw: object) -> OpGraph:
    return build_ops(model, Workload(batch=2, seq=128, mode="inf", framework=framework, **kw))  # type: ignore[arg-type]


def _launches(g: OpGraph, families: frozenset[OpFamily] | set[OpFamily]) -> Counter[KernelSpec]:
    out: Counter[KernelSpec] = Counter()
    for op in g.ops:
        if op.kernel.family in families:
            out[op.kernel] += op.count
    return out


LLAMA = {"architecture": "llama", "activation": "swiglu", "norm": "rmsnorm", "num_kv_heads": 2}


@pytest.mark.parametrize(
    "update",
    [{"architecture": "gpt2"}, {"architecture": "bert"}, {"architecture": "opt"}, LLAMA],
    ids=["gpt2", "bert", "opt", "llama-gqa"],
)
def test_compiled_runs_the_eager_gemms_and_fewer_other_kernels(update: dict[str, object]) -> None:
    """The same GEMM and bmm launches as eager; fewer launches and fewer bytes of the rest."""
    model = GPT2.model_copy(update=update)
    eager, comp = _graph(model, "hf-eager"), _graph(model, "hf-compile")
    assert _launches(comp, GEMM_FAMILIES) == _launches(eager, GEMM_FAMILIES)
    rest = set(OpFamily) - set(GEMM_FAMILIES)
    assert comp.launches(Phase.FORWARD) < eager.launches(Phase.FORWARD)
    nbytes = [sum(k.bytes() * n for k, n in _launches(g, rest).items()) for g in (eager, comp)]
    assert nbytes[1] < nbytes[0]
    assert {op.phase for op in comp.ops} == {Phase.FORWARD}


def test_a_gpt2_layer_is_twelve_kernels_with_the_residual_adds_in_its_norms() -> None:
    """Per layer: 4 linears, 2 bmm, one softmax, two copies (the q, k, v head split in one
    kernel, the head merge), two layer norms that read both addends and write the sum and the
    output (priced as 2T rows), one GeLU."""
    g = _graph(GPT2, "hf-compile")
    layer = [op for op in g.ops if op.name.startswith("layer.")]
    assert len(layer) == 12 and {op.count for op in layer} == {GPT2.num_layers}
    fams = Counter(op.kernel.family for op in layer)
    assert fams == {
        OpFamily.LINEAR: 4,
        OpFamily.BMM: 2,
        OpFamily.SOFTMAX: 1,
        OpFamily.MEMORY: 2,
        OpFamily.LAYERNORM: 2,
        OpFamily.ELEMENTWISE: 1,
    }
    tokens = 2 * 128
    norms: Counter[tuple[int, ...]] = Counter()
    for op in g.ops:
        if op.kernel.family is OpFamily.LAYERNORM:
            norms[op.kernel.dims] += op.count
    # two a layer (2 reads + 2 writes) and the final one (2 reads + 1 write)
    assert norms == {(2 * tokens, H): 2 * GPT2.num_layers, (3 * tokens // 2, H): 1}
    (act,) = [op.kernel for op in layer if op.kernel.family is OpFamily.ELEMENTWISE]
    assert act.dims == (tokens, F) and act.op == "gelu"


def test_head_splits_are_one_copy_per_tensor_they_read() -> None:
    """GPT-2's q, k and v come from one projection: one copy of all three; BERT's from three:
    q and k in one copy, v in another (as Inductor compiles them); Llama's q and k are laid
    out by their rotary kernel, so only v (or GQA's repeats) is copied."""
    tokens = 2 * 128

    def splits(update: dict[str, object]) -> list[tuple[int, ...]]:
        g = _graph(GPT2.model_copy(update=update), "hf-compile")
        return [op.kernel.dims for op in g.ops if ".split_" in op.name]

    assert splits({}) == [(tokens, 3 * H)]
    assert splits({"architecture": "bert"}) == [(tokens, 2 * H), (tokens, H)]
    assert splits({**LLAMA, "num_kv_heads": 0}) == [(tokens, H)]
    gqa = _graph(GPT2.model_copy(update=LLAMA), "hf-compile")
    assert not any(".split_" in op.name for op in gqa.ops)
    assert sum(".repeat_" in op.name for op in gqa.ops) == 2


def test_a_bert_embedding_is_one_norm_over_its_three_gathers() -> None:
    bert = GPT2.model_copy(update={"architecture": "bert", "id": "bert", "activation": "gelu"})
    embed = [op for op in _graph(bert, "hf-compile").ops if op.name.startswith("embed.")]
    assert [(op.kernel.family, op.kernel.dims) for op in embed] == [
        (OpFamily.LAYERNORM, (2 * 256, H))
    ]


@pytest.mark.parametrize(
    ("kw", "what"),
    [({"mode": "train"}, "training"), ({"kv_cache": True}, "generation with a KV cache")],
)
def test_training_and_generation_are_refused_naming_the_way_out(
    kw: dict[str, object], what: str
) -> None:
    run = {"batch": 2, "seq": 128, "mode": "inf", "framework": "hf-compile", **kw}
    with pytest.raises(ConfigError, match=f"{what} under torch.compile is not modelled"):
        build_ops(GPT2, Workload.model_validate(run))


def test_an_architecture_without_a_compiled_inventory_names_those_that_have_one() -> None:
    experts = {"num_experts": 4, "experts_per_token": 2}
    mixtral = GPT2.model_copy(update={**LLAMA, **experts, "architecture": "mixtral"})
    have = r"have: .*hf-compile/gpt2, hf-compile/llama, hf-compile/opt, hf-eager"
    with pytest.raises(ConfigError, match=f"no hf-compile inventory for mixtral; {have}"):
        _graph(mixtral, "hf-compile")
    for arch in ({}, LLAMA):
        moe = GPT2.model_copy(update={**arch, **experts})
        with pytest.raises(ConfigError, match=r"has no expert .* use framework hf-eager or"):
            _graph(moe, "hf-compile")


def test_predict_cli_runs_hf_compile_and_serve_refuses_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--model", "tiny-gpt", "--gpu", "a100-pcie-40gb", "--batch", "2", "--seq", "128"]
    assert main(["predict", *flags, "--mode", "inf", "--framework", "hf-compile", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["e2e_ms"] > 0 and out["bw_ms"] == 0
    assert main(["predict", *flags, "--mode", "train", "--framework", "hf-compile"]) == 2
    assert "training under torch.compile is not modelled" in capsys.readouterr().err
    serve = ["serve", "--model", "tiny-gpt", "--gpu", "l4", "--batch", "1", "--prompt", "8"]
    assert main([*serve, "--gen", "2", "--framework", "hf-compile"]) == 2
    assert "--framework hf-compile: use megatron" in capsys.readouterr().err


def test_compiled_forecast_is_below_eager_on_a_memory_bound_model() -> None:
    """Fusion removes memory traffic only: never slower than eager, faster where the
    element-wise kernels weigh (a narrow model with long sequences)."""
    gpu, lat = load_gpu("l4"), load_latency_model("roofline")
    frameworks: tuple[Framework, ...] = ("hf-eager", "hf-compile")
    runs = [Workload(batch=2, seq=256, mode="inf", framework=f) for f in frameworks]
    eager, comp = (predict_run(GPT2, gpu, r, lat).e2e_ms for r in runs)
    assert comp < 0.9 * eager


def _write(folder: Path, name: str, ms: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    label = {"num_layer": 0, "e2e_latency": ms, "fw_latency": ms, "bwall_latency": 0}
    (folder / f"{name}.json").write_text(json.dumps(label))


def test_fusion_labels_are_read_apart_as_hf_compile_runs(tmp_path: Path) -> None:
    folder = tmp_path / "labels" / "NVIDIA_L4"
    _write(folder, "gpt2_large-inf-1024-4", 100.0)
    _write(folder, "gpt2_large-inf-1024-4-fusion", 70.0)
    _write(folder, "gpt2_large-train-1024-4-dp4", 9.0)
    eager, _ = load_labels(tmp_path)
    compiled, _ = load_labels(tmp_path, compiled=True)
    assert [(lab.e2e_ms, lab.run.framework) for lab in eager] == [(100.0, "hf-eager")]
    assert [(lab.e2e_ms, lab.run.framework) for lab in compiled] == [(70.0, "hf-compile")]


def test_the_compile_table_sets_each_run_beside_its_eager_twin(tmp_path: Path) -> None:
    """Measured 70 / 100 = 0.70 beside the forecast's own compiled / eager ratio."""
    folder = tmp_path / "labels" / "NVIDIA_L4"
    _write(folder, "tiny-inf-128-2", 100.0)
    _write(folder, "tiny-inf-128-2-fusion", 70.0)
    models = tmp_path / "models"
    models.mkdir()
    tiny = load_model("tiny-gpt")
    (models / "tiny.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": tiny.num_layers,
                "n_embd": tiny.hidden_size,
                "n_head": tiny.num_heads,
                "vocab_size": tiny.vocab_size,
                "n_positions": 1024,
            }
        )
    )
    runs = {}
    for compiled in (False, True):
        labels, _ = load_labels(tmp_path, compiled=compiled)
        runs[compiled] = {
            k: prepare(labels, tmp_path, load_latency_model(k)) for k in ("tile-mlp", "roofline")
        }
    rows = compiled_rows(runs[True], runs[False])
    (line,) = rows[2:]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["l4", "tiny inf seq 128 batch 2", "70.0"]
    measured, ours = cells[-1].split(", ")
    assert measured == "0.70" and 0 < float(ours) < 1
    assert (COMPILE_BEGIN, COMPILE_END) in E2E_MARKERS
