"""Closed forms and metamorphic checks of the distributed step: what one GPU holds of a MoE
layer, the expert-data-parallel group its expert gradients reduce over (and the screen's
mirror of it), the sharded optimizer step of expert state, faster links, and models the
simulator cannot split into stages."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from simulator.comm import activation_bytes, collective_s
from simulator.dp_comm import grad_buckets, grad_sync_s
from simulator.errors import ConfigError
from simulator.models import load_model
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.screen import _dp_s, _zero3_gather_scatter_s
from simulator.screen_cache import ScreenCache
from simulator.shard_params import chunk_params
from simulator.simulate import latency_table, layout_of, simulate
from simulator.stagecost import block_times, shard_kernels
from simulator.stepcosts import stage_params, step_costs
from topologies import Cluster

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
# 4 experts per layer on 16 GPUs: tp 2 x pp 2 x dp 4
MOE = ("model.num_experts=4", "cluster.num_gpus=16", "training.latency_model='roofline-derated'")


def _tiny(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=sets))


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_a_moe_layer_on_one_gpu_holds_its_share_of_the_experts(ep: int) -> None:
    """Mixtral 8x7B at tp 1: one MoE layer on one GPU is attention, norms and router plus 8/ep
    experts of 3 h f each. With ep 8 it held 1.7x that: the layer's dense-sized MLP counted
    as a replicated part and 7/8 of an expert on top."""
    m = load_model("mixtral-8x7b")
    h, f, kv = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.dhead
    shared = h * (h + 2 * kv) + h * h + 2 * h + 8 * h  # attention, two RMSNorms, router
    want = shared + 8 // ep * 3 * h * f
    assert chunk_params(m, RunConfig(ep=ep), 1, first=False, last=False) == want


def _experts(inputs: SimInputs, lay: Any) -> list[float]:
    """Expert parameters one GPU of each stage holds, in closed form: 4 GeLU experts of
    2 h f + f + h per layer, over tp x ep."""
    m, run = inputs.model, lay.run
    h, f = m.hidden_size, m.ffn_hidden_size
    per_layer = m.num_experts * (2 * h * f + f + h) / (run.tp * run.ep)
    return [sum(chunks) * per_layer for chunks in lay.layers_per_stage]


def _moe_layout(ep: int, zero: int = 1, **kw: Any) -> tuple[SimInputs, Any]:
    inputs = _tiny(*MOE)
    kw.setdefault("sequence_parallel", True)  # Megatron-LM's MoE with TP
    run = RunConfig(tp=2, pp=2, dp=4, ep=ep, micro_batch_size=1, zero_stage=zero, **kw)
    return inputs, layout_of(inputs, run)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group() -> None:
    """Megatron-LM reduces expert gradients over the dp*cp/ep ranks holding the same experts
    (stride tp*ep), dense ones over dp*cp: a chunk's reduction is one collective of each per
    bucket. It reduced all of them over dp*cp."""
    inputs, lay = _moe_layout(ep=2)
    assert lay.edp_group == (0, 4)  # dp*cp/ep = 2 ranks, tp*ep apart
    assert len(lay.dp_group) == 4
    table = latency_table(inputs, [lay.run])
    costs = step_costs(inputs, lay, table)
    n, cl = grad_buckets(lay), inputs.cluster
    expert = _experts(inputs, lay)
    total = stage_params(inputs, lay)
    assert all(e > 0 for e in expert)
    for s, row in enumerate(costs.chunks):
        (chunk,) = row
        dense = collective_s("reduce-scatter", (total[s] - expert[s]) * 4 / n, lay.dp_group, cl)
        experts = collective_s("reduce-scatter", expert[s] * 4 / n, lay.edp_group, cl)
        assert chunk.grad_sync_s == pytest.approx(n * (dense + experts), rel=1e-12)
    # every rank of dp*cp holding its own experts: they need no reduction at all
    inputs, lay4 = _moe_layout(ep=4)
    assert lay4.edp_group == (0,)
    dense_only = [(p - e) * 4 for p, e in zip(total, expert, strict=True)]
    got = [grad_sync_s(p, inputs, lay4, e) for p, e in zip(total, expert, strict=True)]
    want = [n * collective_s("reduce-scatter", d / n, lay4.dp_group, cl) for d in dense_only]
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2])
def test_screen_reduces_expert_gradients_as_the_simulation_does(zero: int) -> None:
    """The screen's DP tail (no overlap, one chunk) is the simulation's gradient reduction plus
    the sharded optimizer's parameter all-gather, each one collective over the dense ranks
    and one over the expert-data-parallel group. ZeRO-2 accumulating over micro-batches runs
    the reduction after every backward instead (`stepcosts.scatters_every_backward`): the
    same collective, priced per backward, and only the all-gather is left in the tail."""
    inputs, lay = _moe_layout(ep=2, zero=zero, overlap_grad_reduce=False)
    table = latency_table(inputs, [lay.run])
    costs = step_costs(inputs, lay, table)
    cache = ScreenCache(inputs, table)
    cl, dp, edp = inputs.cluster, lay.dp_group, lay.edp_group
    for s, (p, e) in enumerate(zip(stage_params(inputs, lay), _experts(inputs, lay), strict=True)):
        want = collective_s("reduce-scatter", (p - e) * 4, dp, cl)
        want += collective_s("reduce-scatter", e * 4, edp, cl)
        want += collective_s("all-gather", (p - e) * 2, dp, cl)
        want += collective_s("all-gather", e * 2, edp, cl)
        chunk = costs.chunks[s][0]
        sim = chunk.grad_sync_s + chunk.zero3_scatter_s + costs.param_gather_s[s]
        assert sim == pytest.approx(want, rel=1e-12)
        per_backward = _zero3_gather_scatter_s(cache, lay, (p, e))[1] if zero == 2 else 0.0
        assert chunk.zero3_scatter_s == pytest.approx(per_backward, rel=1e-9)
        assert _dp_s(cache, lay, (p, e), 0.0) + per_backward == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("zero", [1, 2])
def test_sharded_optimizer_steps_the_same_state_whatever_the_ep(zero: int) -> None:
    """ZeRO splits an expert's state over the dp*cp/ep ranks that hold it: with 4 experts on dp
    4, ep 2 halves each GPU's experts and the ranks sharing each, so every GPU steps as many
    parameters as at ep 1 (the optimizer step divided expert state by dp*cp, halving it)."""
    inputs = _tiny(*MOE)

    def optimizer_s(ep: int) -> tuple[float, ...]:
        run = RunConfig(
            tp=2, pp=2, dp=4, ep=ep, micro_batch_size=1, zero_stage=zero, sequence_parallel=True
        )
        return step_costs(inputs, layout_of(inputs, run), latency_table(inputs, [run])).optimizer_s

    assert optimizer_s(2) == pytest.approx(optimizer_s(1), rel=1e-12)
    run = RunConfig(
        tp=2, pp=2, dp=4, ep=4, micro_batch_size=1, zero_stage=zero, sequence_parallel=True
    )
    lay = layout_of(inputs, run)
    table = latency_table(inputs, [run])
    adam = block_times(shard_kernels(inputs, run), table, run).adam_s_per_param
    p, e = stage_params(inputs, lay), _experts(inputs, lay)
    want = [((pi - ei) / 4 + ei) * adam for pi, ei in zip(p, e, strict=True)]
    assert step_costs(inputs, lay, table).optimizer_s == pytest.approx(want, rel=1e-12)


def _faster(inputs: SimInputs, scale: float) -> SimInputs:
    spec = inputs.cluster.spec
    net = spec.network
    assert net is not None
    link = net.link.model_copy(
        update={"bw_bytes_per_s_per_dir": net.link.bw_bytes_per_s_per_dir * scale}
    )
    srv = spec.server
    intra = srv.intra.model_copy(
        update={"bw_bytes_per_s_per_dir": srv.intra.bw_bytes_per_s_per_dir * scale}
    )
    spec = spec.model_copy(
        update={
            "network": net.model_copy(update={"link": link}),
            "server": srv.model_copy(update={"intra": intra}),
        }
    )
    return dataclasses.replace(inputs, cluster=Cluster(spec))


@pytest.mark.parametrize(
    "run",
    [
        RunConfig(tp=2, pp=2, dp=4, ep=2, micro_batch_size=1, zero_stage=1, sequence_parallel=True),
        RunConfig(tp=2, pp=1, dp=8, ep=4, micro_batch_size=1, zero_stage=3, sequence_parallel=True),
        RunConfig(tp=1, pp=2, dp=8, ep=4, micro_batch_size=1, sequence_parallel=True),
    ],
)
def test_faster_links_never_slow_a_moe_step(run: RunConfig) -> None:
    inputs = _tiny(*MOE)
    table = latency_table(inputs, [run])
    base = simulate(inputs, run, table).iteration_s
    assert simulate(_faster(inputs, 2.0), run, table).iteration_s <= base


def test_an_encoder_decoder_model_is_one_config_error() -> None:
    """Switch (encoder and decoder stacks) has no one repeated layer to stage: one line naming
    the model (it was a KeyError traceback)."""
    inputs = dataclasses.replace(
        _tiny("training.framework='hf-eager'"), model=load_model("switch-base-4")
    )
    with pytest.raises(ConfigError, match="model: switch-base-4"):
        latency_table(inputs, [RunConfig(tp=1, pp=1, dp=8)])


@pytest.mark.parametrize("sp", [False, True])
def test_the_output_layer_and_embedding_pay_their_tp_collectives(sp: bool) -> None:
    """pp 2, equal layers per stage: the stages' TP time differs only by the embedding's
    collectives (first) and the output layer's (last): without SP a forward all-reduce after
    the embedding, a backward all-reduce of the output layer's input gradient; with SP a
    forward reduce-scatter / backward all-gather, and a forward all-gather / backward
    reduce-scatter. The output layer's were not counted."""
    inputs = _tiny("training.latency_model='roofline-derated'")
    run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=1, sequence_parallel=sp)
    lay = layout_of(inputs, run)
    assert lay.layers_per_stage[0] == lay.layers_per_stage[1]
    (first,), (last,) = step_costs(inputs, lay, latency_table(inputs, [run])).chunks
    a = activation_bytes(inputs, lay)
    ar, ag, rs = (collective_s(op, a, lay.tp_group, inputs.cluster) for op in OPS3)
    embed_fw, embed_bw, head_fw, head_bw = (rs, ag, ag, rs) if sp else (ar, 0.0, 0.0, ar)
    assert head_bw > 0
    assert first.fw_tp_s - last.fw_tp_s == pytest.approx(embed_fw - head_fw, abs=1e-15)
    assert last.bw_tp_s - first.bw_tp_s == pytest.approx(head_bw - embed_bw, abs=1e-15)


OPS3 = ("all-reduce", "all-gather", "reduce-scatter")
