"""Closed forms of the model catalog: parameter counts and FLOPs."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.models import load_model
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
    assert m.expert_rows(2 * 2048, 2) == 2 * 64
    assert m.expert_rows(2 * 128, 2) == 2 * 32  # under the cap: balanced routing
    assert m.model_copy(update={"expert_capacity": 0}).expert_rows(2 * 2048, 2) == 1024


def test_a_sequence_beyond_learned_positions_is_refused() -> None:
    """GPT-2-style models index a learned position table: longer sequences cannot run."""
    tiny = load_model("tiny-gpt")  # 512 learned positions
    tiny.check_sequence(512)
    with pytest.raises(ConfigError, match="513 exceeds model tiny-gpt's 512 learned positions"):
        build_ops(tiny, Workload(batch=1, seq=513, mode="inf"))
    load_model("llama3-8b").check_sequence(1_000_000)  # rotary: no table to outgrow
