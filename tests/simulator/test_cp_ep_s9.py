"""Closed forms and metamorphic checks of context and expert parallelism: the bytes ring
attention moves forward and backward, the ring a recomputed attention core runs again, the
all-to-all bytes of a MoE layer, and the screen's agreement with the full simulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.kernels import ITEMSIZE_BYTES
from simulator.comm import activation_bytes, collective_s, layer_comm
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.screen import ScreenCache, _stage_mb_s
from simulator.simulate import latency_table, layout_of, simulate
from simulator.stagecost import block_times, shard_kernels
from simulator.stepcosts import step_costs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
# 8 ranks of one CP ring over two 4-GPU nodes on EDR: the ring's K,V outlast the short
# attention blocks of a 4096-token sequence, forward and backward
CP_RING = ("model.seq_len=4096", "cluster.network='ib-edr'", "training.global_batch_size=2")


def _tiny(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=sets))


def _kv_bytes(inputs: SimInputs, run: RunConfig) -> float:
    """K and V of the whole sequence on one TP rank: 2 b s kv_heads dhead / tp elements."""
    m = inputs.model
    elems = 2 * run.micro_batch_size * inputs.seq_len * m.kv_heads * m.dhead / run.tp
    return elems * ITEMSIZE_BYTES[inputs.dtype]


def test_cp_backward_ring_moves_k_v_again_with_their_gradients() -> None:
    """TransformerEngine's ring attention saves only a rank's own K and V, so its backward
    circulates K,V again in one buffer with the dK,dV accumulated so far: a ring pass of twice
    the forward's bytes. The backward charged a reduce-scatter of dK,dV alone, as if every
    rank had kept the gathered K,V (which the 1/cp activation memory does not hold)."""
    inputs = _tiny(*CP_RING)
    run = RunConfig(tp=1, pp=1, cp=8, dp=1, micro_batch_size=1)
    lay = layout_of(inputs, run)
    lc = layer_comm(inputs, lay)
    kv = _kv_bytes(inputs, run)
    assert lc.cp_fw_s == collective_s("all-gather", kv, lay.cp_group, inputs.cluster)
    assert lc.cp_bw_s == collective_s("reduce-scatter", 2 * kv, lay.cp_group, inputs.cluster)
    assert lc.cp_bw_s > lc.cp_fw_s
    # the chunk's exposed backward ring: the excess over the backward attention core
    table = latency_table(inputs, [run])
    bt = block_times(shard_kernels(inputs, run), table, run)
    chunk = step_costs(inputs, lay, table).chunks[0][0]
    layers = lay.layers_per_stage[0][0]
    assert chunk.bw_cp_s == pytest.approx(layers * (lc.cp_bw_s - bt.attention_bw_s))
    assert chunk.bw_cp_s > 0


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_a_recomputed_attention_core_runs_its_cp_ring_again(recompute: str) -> None:
    """Selective recompute re-runs the attention core and full recompute the whole layer
    forward; under CP the core is the ring, so the backward pays the forward ring's exposed
    part again (as it pays TP's and EP's forward collectives again under full recompute). The
    exposed CP time was the same with and without recompute."""
    inputs = _tiny(*CP_RING)
    plain = RunConfig(tp=1, pp=1, cp=8, dp=1, micro_batch_size=1)
    redo = plain.model_copy(update={"recompute": recompute})
    table = latency_table(inputs, [plain])
    c0 = step_costs(inputs, layout_of(inputs, plain), table).chunks[0][0]
    c1 = step_costs(inputs, layout_of(inputs, redo), table).chunks[0][0]
    assert c0.fw_cp_s > 0
    assert c1.fw_cp_s == c0.fw_cp_s
    assert c1.bw_cp_s == pytest.approx(c0.bw_cp_s + c0.fw_cp_s)
    # the screen charges the same ring again: its micro-batch through the stage grows by what
    # the simulated chunk's forward and backward grow by
    cache = ScreenCache(inputs, table)
    d_screen = _stage_mb_s(cache, layout_of(inputs, redo))[0]
    d_screen -= _stage_mb_s(cache, layout_of(inputs, plain))[0]
    d_sim = sum(c1.parts("F")) + sum(c1.parts("B")) - sum(c0.parts("F")) - sum(c0.parts("B"))
    assert d_screen == pytest.approx(d_sim, rel=1e-12)
    exposed = [simulate(inputs, r, table).exposed_comm_s["cp"] for r in (plain, redo)]
    assert exposed[1] > exposed[0]


def test_cp_of_one_is_no_context_parallelism() -> None:
    """cp = 1 is a ring of one rank: nothing moves, forward, backward or recomputed."""
    inputs = _tiny(*CP_RING[:2], "training.global_batch_size=8")
    run = RunConfig(tp=1, pp=1, cp=1, dp=8, micro_batch_size=1, recompute="full")
    table = latency_table(inputs, [run])
    lay = layout_of(inputs, run)
    lc = layer_comm(inputs, lay)
    assert (lc.cp_fw_s, lc.cp_bw_s) == (0.0, 0.0)
    chunk = step_costs(inputs, lay, table).chunks[0][0]
    assert (chunk.fw_cp_s, chunk.bw_cp_s) == (0.0, 0.0)
    assert simulate(inputs, run, table).exposed_comm_s["cp"] == 0.0


@pytest.mark.parametrize(("ep", "tp"), [(2, 1), (4, 1), (4, 2)])
def test_moe_all_to_all_bytes_closed_form(ep: int, tp: int) -> None:
    """Per MoE layer and micro-batch: dispatch and combine, each an all-to-all of
    ``b * s/cp * h * top_k`` bytes over the ep ranks (``/ tp`` under sequence parallelism:
    each TP rank dispatches its own s/tp tokens), forward; the same backward."""
    sets = ("model.num_experts=8", "model.experts_per_token=2", "cluster.num_gpus=16")
    inputs = _tiny(*sets)
    run = RunConfig(tp=tp, pp=1, cp=2, dp=0, ep=ep, micro_batch_size=1, sequence_parallel=tp > 1)
    lay = layout_of(inputs, run)
    m = inputs.model
    a = run.micro_batch_size * inputs.seq_len // run.cp * m.hidden_size * 2  # bf16
    assert activation_bytes(inputs, lay) == a
    per_rank = a * m.experts_per_token / tp
    one = collective_s("all-to-all", per_rank, lay.ep_group, inputs.cluster)
    lc = layer_comm(inputs, lay)
    assert one > 0
    assert (lc.ep_fw_s, lc.ep_bw_s) == (2 * one, 2 * one)


def test_every_expert_parallel_shard_runs_the_same_expert_work() -> None:
    """8 experts, top 2: whatever ep, one GPU's MoE layer runs ``tokens x 2`` expert rows
    through its E/ep experts, a router over all 8 experts and the permutes. At ep = 8 the shard
    holds one expert: still an expert layer (it was priced as a dense FFN of ``tokens`` rows,
    half the work, without router or permutes)."""
    from forecast.kernels import OpFamily

    sets = ("model.num_experts=8", "model.experts_per_token=2", "cluster.num_gpus=16")
    inputs = _tiny(*sets)
    m = inputs.model

    def layer(ep: int) -> tuple[float, list[tuple[int, ...]]]:
        run = RunConfig(tp=1, pp=1, cp=1, dp=0, ep=ep, micro_batch_size=1)
        sk = shard_kernels(inputs, run)
        flops = sum(k.flops() * n for k, n in sk.layer_fw)
        gemms = sorted(k.dims for k, _ in sk.layer_fw if k.family is OpFamily.LINEAR)
        return flops, gemms

    flops = {ep: layer(ep)[0] for ep in (1, 2, 4, 8)}
    assert flops[8] == pytest.approx(flops[1], rel=1e-3)
    assert max(flops.values()) / min(flops.values()) < 1.001
    router = (1, inputs.seq_len, m.hidden_size, m.num_experts)  # rows x h -> all 8 experts
    assert any(g[1:] == router[1:] or g == router for g in layer(8)[1])


def test_a_cp_backward_ring_step_hides_behind_the_attention_backward_kernels() -> None:
    """The backward ring is hidden behind the attention core's own backward kernels (FA2's
    backward is about 2.7x its forward in bf16), not 2.5x the forward (the GEMM stand-ins'
    ratio of five GEMMs to two)."""
    inputs = _tiny(*CP_RING)
    run = RunConfig(tp=1, pp=1, cp=8, dp=1, micro_batch_size=1)
    table = latency_table(inputs, [run])
    sk = shard_kernels(inputs, run)
    bt = block_times(sk, table, run)
    # step 0 causal, then 7 unmasked half steps (TransformerEngine's load-balanced ring,
    # test_moe_cp_s10), each the slower of its two shapes
    ring = max(sum(table[k] * n for k, n in r) for r in sk.ring_bw)
    assert bt.attention_bw_s == pytest.approx(
        sum(table[k] * n for k, n in sk.attention_bw) + 7 * ring
    )
    assert {k.op for k, _ in sk.attention_bw} == {"attention_causal_bwd"}
    assert bt.attention_bw_s != pytest.approx(2.5 * bt.attention_fw_s, rel=1e-3)


def test_moe_all_to_all_under_sequence_parallelism_moves_a_ranks_own_tokens() -> None:
    """With sequence parallelism each TP rank dispatches its own s/tp tokens (it moved the
    whole s, tp times the bytes); without it (tp 1: Megatron-LM runs MoE with TP only under
    sequence parallelism) the whole micro-batch is dispatched."""
    inputs = _tiny("model.num_experts=8", "model.experts_per_token=2", "cluster.num_gpus=16")
    run = RunConfig(tp=2, pp=1, cp=1, dp=0, ep=4, micro_batch_size=1, sequence_parallel=True)
    lay = layout_of(inputs, run)
    a = activation_bytes(inputs, lay) * inputs.model.experts_per_token
    one = collective_s("all-to-all", a / 2, lay.ep_group, inputs.cluster)
    assert layer_comm(inputs, lay).ep_fw_s == 2 * one
    whole = layout_of(inputs, run.model_copy(update={"sequence_parallel": False, "tp": 1}))
    a = activation_bytes(inputs, whole) * inputs.model.experts_per_token
    assert layer_comm(inputs, whole).ep_fw_s == 2 * collective_s(
        "all-to-all", a, whole.ep_group, inputs.cluster
    )
