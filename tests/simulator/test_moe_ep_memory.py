"""Expert parallelism divides a GPU's expert weights, gradients and optimizer state by ep.

Mixtral 8x7B (h 4096, f 14336, SwiGLU: 3 h f an expert, 8 experts) at tp 2, pp 4 (8 layers a
stage), dp 8, ZeRO-1, bf16 (2 B weights, 4 B fp32 main gradients, 12 B of Adam state sharded):
a GPU holds ``8 x 8 x 3 h f / (tp ep)`` expert parameters, and shards their Adam state over the
``dp / ep`` ranks holding the same experts, the dense parameters' over all ``dp``.
"""

from __future__ import annotations

import pytest

from simulator.dist_memory import stage_memory
from simulator.parallel import RunConfig
from simulator.scenario import load_scenario, resolve
from simulator.simulate import layout_of
from simulator.stepcosts import stage_expert_params, stage_params

SETS = (
    'model.id="mixtral-8x7b"',
    "model.seq_len=4096",
    "cluster.num_gpus=64",
    "training.global_batch_size=256",
)


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_state_divides_by_ep(ep: int) -> None:
    inputs = resolve(load_scenario("scenarios/llama3_70b_h100.toml", overrides=SETS))
    m = inputs.model
    run = RunConfig(
        tp=2, pp=4, dp=0, ep=ep, micro_batch_size=1, sequence_parallel=True, zero_stage=1
    )
    lay = layout_of(inputs, run)
    assert lay.dp == 8
    expert = 8 * 8 * 3 * m.hidden_size * m.ffn_hidden_size / (2 * ep)
    stage = 1  # no embedding or head
    params, experts = stage_params(inputs, lay)[stage], stage_expert_params(inputs, lay)[stage]
    assert experts == expert
    dense = params - expert
    one = stage_params(inputs, layout_of(inputs, run.model_copy(update={"ep": 1})))[stage]
    assert dense == pytest.approx(one - 8 * 8 * 3 * m.hidden_size * m.ffn_hidden_size / 2)
    mem = stage_memory(inputs, lay, stage, params, in_flight=1)
    assert mem.weights_bytes == 2 * (dense + expert)
    assert mem.gradients_bytes == 4 * (dense + expert)
    assert mem.optimizer_bytes == pytest.approx(12 * (dense / 8 + expert / (8 / ep)))
