"""ZeRO-3 with expert parallelism: expert weights are sharded and gathered over the expert-data-
parallel group, the ranks holding the same experts.

Our layout: tp innermost, ep carved out of dp x cp, each expert split over tp as the dense
layers are (Megatron-core's expert TP = tp). So an expert shard is replicated over
``dp cp / ep`` ranks (Megatron-core's ``dp cp tp / (ep etp)`` with etp = tp): `Layout.edp_group`.
ZeRO-1/2 already shard expert optimizer state and gradients over it (test_moe_ep_memory), and
FSDP's gathers already ran over it (`dp_comm.dp_param_gather_s`). Two places did not:

* the gathered working set (`dist_memory._gathered_params`) counted a MoE layer's experts even
  when the expert group is one rank (ep = dp x cp): nothing is sharded then, nothing gathered,
  and the experts were counted twice (held whole in the shard and again in the working set);
* DeepSpeed-2021's per-tensor gathers (`dp_comm.zero3_blocking_s`) moved the expert tensors over
  the whole dp x cp group, ranks holding other experts among them.

Mixtral 8x7B at tp 2, pp 4 (8 layers a stage, stage 1 holds no embedding or head), dp 8.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulator.dist_memory import stage_memory
from simulator.dp_comm import DEEPSPEED_2021_ZERO3_EFFICIENCY, zero3_blocking_s
from simulator.parallel import Layout, RunConfig
from simulator.scenario import load_scenario, resolve
from simulator.shard_params import expert_layer_params, moe_layer_params
from simulator.simulate import layout_of
from simulator.stepcosts import stage_expert_params, stage_params
from topologies import collective_time_s

SETS = (
    'model.id="mixtral-8x7b"',
    "model.seq_len=4096",
    "cluster.num_gpus=64",
    "training.global_batch_size=256",
)
INPUTS = resolve(load_scenario("scenarios/llama3_70b_h100.toml", overrides=SETS))


def _layout(ep: int, **kw: Any) -> Layout:
    run = RunConfig(
        tp=2, pp=4, dp=0, ep=ep, micro_batch_size=1, sequence_parallel=True, zero_stage=3, **kw
    )
    return layout_of(INPUTS, run)


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_zero3_weights_shard_and_gather_experts_over_their_group(ep: int) -> None:
    """Weights of stage 1 (bf16): ``2 (dense / 8 + expert / (8 / ep) + gathered)``, gathered =
    two MoE layers whole, less their experts when the expert group is one rank (ep 8)."""
    lay = _layout(ep)
    assert len(lay.edp_group) == 8 // ep
    m, run, stage = INPUTS.model, lay.run, 1
    params, expert = stage_params(INPUTS, lay)[stage], stage_expert_params(INPUTS, lay)[stage]
    layer = moe_layer_params(m, run) - (expert_layer_params(m, run) if ep == 8 else 0.0)
    mem = stage_memory(INPUTS, lay, stage, params, in_flight=1)
    want = 2 * ((params - expert) / 8 + expert / (8 / ep) + 2 * layer)
    assert mem.weights_bytes == pytest.approx(want, rel=1e-12)
    assert mem.optimizer_bytes == pytest.approx(12 * ((params - expert) / 8 + expert * ep / 8))


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_deepspeed_zero3_gathers_expert_tensors_over_the_expert_group(ep: int) -> None:
    """Per MoE layer and forward: a ring all-gather of each non-expert tensor over dp (8 ranks)
    and of each of the ``8 / ep`` local experts' three ``h f / tp`` matrices over the ``8 / ep``
    ranks holding them (none at ep 8), at the fitted efficiency."""
    lay = _layout(ep, zero3_impl="deepspeed-2021")
    m, run, cl = INPUTS.model, lay.run, INPUTS.cluster
    h, f = m.hidden_size, m.ffn_hidden_size
    tensors = m.layer_param_tensors(moe=True, tp=run.tp, ep=ep)
    local = [h * f // run.tp] * (3 * 8 // ep)
    dense = list(tensors)
    for t in local:
        dense.remove(t)

    def ring(ts: list[int], group: tuple[int, ...]) -> float:
        if len(group) < 2:
            return 0.0
        return sum(collective_time_s("all-gather", 2 * t, group, cl, algorithm="ring") for t in ts)

    per_layer = ring(dense, lay.dp_group) + ring(local, lay.edp_group)
    fw, _ = zero3_blocking_s(INPUTS, lay, 8, first=False, last=False)
    assert fw == pytest.approx(8 * per_layer / DEEPSPEED_2021_ZERO3_EFFICIENCY, rel=1e-12)
