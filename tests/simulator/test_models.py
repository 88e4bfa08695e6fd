"""Closed forms of the model catalog: parameter counts and FLOPs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.models import CATALOG_DIR, load_model
from simulator.moe_routing import expert_rows
from simulator.opgraph import Phase, Workload, build_ops


@pytest.mark.parametrize(
    ("model_id", "published"),
    [("gpt3-175b", 175e9), ("llama2-7b", 6.74e9), ("llama2-70b", 68.98e9), ("llama3-8b", 8.03e9)],
)
def test_parameter_counts_match_published(model_id: str, published: float) -> None:
    assert load_model(model_id).num_params() == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("model_id", ["gpt3-175b", "llama2-7b", "llama2-70b"])
def test_forward_gemm_flops_are_twice_the_params_per_token(model_id: str) -> None:
    model = load_model(model_id)
    run = Workload(batch=1, seq=128, mode="inf")
    graph = build_ops(model, run)
    gemm = sum(
        op.count * op.kernel.flops()
        for op in graph.ops
        if op.kernel.family.value == "linear" and "head" not in op.name
    )
    per_token = gemm / run.tokens
    assert per_token == pytest.approx(2 * model.num_params(embeddings=False), rel=0.02)


@pytest.mark.parametrize("framework", ["hf-eager", "megatron"])
def test_training_flops_are_three_times_forward(framework: str) -> None:
    graph = build_ops(
        load_model("gpt3-175b"), Workload(batch=1, seq=2048, mode="train", framework=framework)
    )
    fw = sum(o.count * o.kernel.flops() for o in graph.ops if o.phase is Phase.FORWARD)
    bw = sum(o.count * o.kernel.flops() for o in graph.ops if o.phase is Phase.BACKWARD)
    assert (fw + bw) / fw == pytest.approx(3.0, rel=0.05)


def test_unknown_hf_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"model_type": "mamba"}')
    with pytest.raises(ConfigError, match="supported: gpt2, opt, bert"):
        load_model(cfg)


def test_unknown_model_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        load_model("no-such-model")


def test_inference_has_no_backward_or_optimizer() -> None:
    graph = build_ops(load_model("tiny-gpt"), Workload(batch=2, seq=64, mode="inf"))
    assert {op.phase for op in graph.ops} == {Phase.FORWARD}
    assert not any(op.kernel.op == "dropout" for op in graph.ops)


def test_switch_expert_capacity_caps_each_sequence() -> None:
    """HF Switch counts a token's place in its expert's queue along its own sequence (a cumsum
    over the sequence axis), so the cap of 64 binds per sequence: two sequences of 2048 tokens
    on 4 experts give each expert 2 x 64 rows, not 64."""
    update = {"num_experts": 4, "experts_per_token": 1, "expert_capacity": 64}
    m = load_model("mixtral-8x7b").model_copy(update=update)
    assert expert_rows(m, 2 * 2048, 2) == 2 * 64
    assert expert_rows(m, 2 * 128, 2) == 2 * 32  # under the cap: balanced routing
    assert expert_rows(m.model_copy(update={"expert_capacity": 0}), 2 * 2048, 2) == 1024


def test_a_sequence_beyond_learned_positions_is_refused() -> None:
    """GPT-2-style models index a learned position table: longer sequences cannot run."""
    tiny = load_model("tiny-gpt")  # 512 learned positions
    tiny.check_sequence(512)
    with pytest.raises(ConfigError, match="513 exceeds model tiny-gpt's 512 learned positions"):
        build_ops(tiny, Workload(batch=1, seq=513, mode="inf"))
    load_model("llama3-8b").check_sequence(1_000_000)  # rotary: no table to outgrow


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
         "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 1000, "max_position_embeddings": 2048}  # fmt: skip
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 1280, "n_head": 20, "vocab_size": 1000}
OPT = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 256, "ffn_dim": 1024,
       "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 2048}  # fmt: skip


@pytest.mark.parametrize(
    ("base", "edit", "key"),
    [
        (LLAMA, {"num_local_experts": "8"}, "num_local_experts"),  # was a TypeError traceback
        (LLAMA, {"num_local_experts": None}, "num_local_experts"),
        (OPT, {"max_position_embeddings": None}, "max_position_embeddings"),  # was TypeError
        (LLAMA, {"hidden_size": 2}, "num_attention_heads"),  # was "dims must be positive"
        (GPT2, {"n_embd": "1280"}, "n_embd"),  # 4 * "1280" repeated the string
        (GPT2, {"n_head": 7}, "n_head"),  # 1280 / 7 heads
        (GPT2, {"n_layer": True}, "n_layer"),
        (GPT2, {"n_layer": 0}, "n_layer"),
        (LLAMA, {"num_key_value_heads": 3}, "num_key_value_heads"),
        (LLAMA, {"num_key_value_heads": 8}, "num_key_value_heads"),
        (LLAMA, {"num_local_experts": 4, "num_experts_per_tok": 8}, "num_experts_per_tok"),
        (LLAMA, {"tie_word_embeddings": "false"}, "tie_word_embeddings"),  # was read as true
    ],
)
def test_bad_hf_config_names_the_key(
    tmp_path: Path, base: dict[str, object], edit: dict[str, object], key: str
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(base | edit))
    with pytest.raises(ConfigError) as excinfo:
        load_model(cfg)
    message = str(excinfo.value)
    assert str(cfg) in message and repr(key) in message and "\n" not in message


@pytest.mark.parametrize(
    ("base", "edit"),
    [(GPT2, {"n_inner": None}), (LLAMA, {"num_key_value_heads": None}), (LLAMA, {})],
)
def test_hf_defaults_still_load(
    tmp_path: Path, base: dict[str, object], edit: dict[str, object]
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(base | edit))
    model = load_model(cfg)
    assert model.ffn_hidden_size in (4 * model.hidden_size, 512)
    assert model.kv_heads == model.num_heads


def test_non_utf8_hf_config_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_bytes(b'{"model_type": "gpt2", "n_embd": "\xff"}')
    with pytest.raises(ConfigError, match="cannot read HF config"):
        load_model(cfg)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("tied_embeddings = false", 'tied_embeddings = "false"', "tied_embeddings"),
        ("num_kv_heads = 8", "num_kv_heads = 3", "num_kv_heads"),
        ("hidden_size = 4096", 'hidden_size = "4096"', "hidden_size"),
    ],
)
def test_catalog_toml_gets_the_same_checks(tmp_path: Path, old: str, new: str, field: str) -> None:
    text = (CATALOG_DIR / "llama3-8b.toml").read_text()
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new))
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        load_model(path)


def test_predict_cli_bad_hf_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA | {"num_local_experts": "8"}))
    argv = ["predict", "--model", str(cfg), "--gpu", "a100-sxm4-80gb", "--batch", "1"]
    assert main([*argv, "--seq", "128", "--mode", "train", "--dtype", "bf16", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "num_local_experts" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_experts_the_forecast_would_leave_out_are_refused(tmp_path: Path) -> None:
    """A gpt2 with 4 experts under hf-eager ran the dense layer's kernels while its memory
    counted the experts; moe_every = 2 outside Switch ran experts in every layer while its
    parameters counted every other one."""
    tiny = (CATALOG_DIR / "tiny-gpt.toml").read_text()
    moe = tmp_path / "moe.toml"
    moe.write_text(tiny + "num_experts = 4\nexperts_per_token = 2\n")
    run = Workload(batch=2, seq=128, mode="train")
    with pytest.raises(ConfigError, match="no expert layers"):
        build_ops(load_model(str(moe)), run)
    megatron = build_ops(load_model(str(moe)), run.model_copy(update={"framework": "megatron"}))
    assert any("router" in op.name for op in megatron.ops)
    every_other = tmp_path / "every_other.toml"
    every_other.write_text(tiny + "num_experts = 4\nmoe_every = 2\n")
    with pytest.raises(ConfigError, match="moe_every"):
        load_model(str(every_other))
