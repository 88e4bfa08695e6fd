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
from simulator.screen import _stage_mb_s
from simulator.screen_cache import ScreenCache
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
    """TransformerEngine's ring attention saves one K,V a rank, so its backward circulates
    K,V again with the dK,dV accumulated so far: K,V at its first step, both in one buffer at
    the ``cp - 2`` middle ones, dK,dV at the last, ``2 (cp - 1)`` volumes against the
    forward's ``cp - 1``; each step a send to the next rank (``send-recv`` of ``kv / cp``, the
    slowest hop), each exposing its excess over its own step's attention backward."""
    inputs = _tiny(*CP_RING)
    run = RunConfig(tp=1, pp=1, cp=8, dp=1, micro_batch_size=1)
    lay = layout_of(inputs, run)
    lc = layer_comm(inputs, lay)
    kv = _kv_bytes(inputs, run)
    ring = lay.cp_group
    hops = [(a, ring[(i + 1) % 8]) for i, a in enumerate(ring)]
    step = max(collective_s("send-recv", kv / 8, h, inputs.cluster) for h in hops)
    both = max(collective_s("send-recv", 2 * kv / 8, h, inputs.cluster) for h in hops)
    assert (lc.cp_kv_s, lc.cp_kv_grad_s) == (step, both)
    assert both > step
    # the chunk's exposed backward ring: each step's excess over its own attention backward
    table = latency_table(inputs, [run])
    bt = block_times(shard_kernels(inputs, run), table, run)
    r = bt.ring
    chunk = step_costs(inputs, lay, table).chunks[0][0]
    layers = lay.layers_per_stage[0][0]
    per_layer = (step - r.step_bw_s) + 6 * (both - r.step_bw_s) + (step - r.step0_bw_s)
    assert min(step - r.step_bw_s, both - r.step_bw_s, step - r.step0_bw_s) > 0
    assert chunk.bw_cp_s == pytest.approx(layers * per_layer, rel=1e-12)
    assert chunk.fw_cp_s == pytest.approx(
        layers * ((step - r.step0_fw_s) + 6 * (step - r.step_fw_s)), rel=1e-12
    )


def test_the_last_forward_cp_step_hides_no_send() -> None:
    """Forward, TransformerEngine sends the K,V for step ``i + 1`` while it computes step
    ``i`` and sends nothing at the last step: at cp 2 the one send hides behind step 0's
    attention alone. It was hidden behind both steps (the whole ring's attention), so a send
    longer than one step and shorter than two was exposed as 0."""
    inputs = _tiny("model.seq_len=8192", "cluster.network='ib-edr'", "training.global_batch_size=4")
    run = RunConfig(tp=1, pp=1, cp=2, dp=4, micro_batch_size=1)
    lay = layout_of(inputs, run)
    table = latency_table(inputs, [run])
    bt = block_times(shard_kernels(inputs, run), table, run)
    lc = layer_comm(inputs, lay)
    kv_s, r = lc.cp_kv_s, bt.ring
    assert r.step0_fw_s < kv_s < r.step0_fw_s + r.step_fw_s
    chunk = step_costs(inputs, lay, table).chunks[0][0]
    layers = lay.layers_per_stage[0][0]
    assert chunk.fw_cp_s == pytest.approx(layers * (kv_s - r.step0_fw_s), rel=1e-12)
    # backward: K,V at step 0 (a half step), dK,dV at step 1 (the causal one)
    bw = max(0.0, kv_s - r.step_bw_s) + max(0.0, kv_s - r.step0_bw_s)
    assert chunk.bw_cp_s == pytest.approx(layers * bw, rel=1e-12)


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
    assert (lc.cp_kv_s, lc.cp_kv_grad_s) == (0.0, 0.0)
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
