"""Closed forms of mixture-of-experts and context-parallel pricing in the distributed simulator:
the expert-side TP gather of the routed tokens, Megatron's expert capacity, the causal pairs a
context-parallel rank computes in the load-balanced (zig-zag) ring, and the router and permutes
under sequence parallelism."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from forecast.kernels import ITEMSIZE_BYTES, OpFamily
from simulator.comm import activation_bytes, collective_s, layer_comm
from simulator.errors import ConfigError
from simulator.models import load_model
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import latency_table, layout_of
from simulator.stagecost import block_times, shard_kernels
from simulator.stepcosts import tp_bw_exposed_s

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
SEQ = 4096


def _tiny(*sets: str) -> SimInputs:
    base = ("model.seq_len=4096", "training.global_batch_size=8")
    return resolve(load_scenario(TINY, overrides=(*base, *sets)))


def _mixtral(capacity: int = 0) -> SimInputs:
    """Mixtral 8x7B (8 experts, top 2) on the tiny scenario's 8 A100s, 4,096 tokens."""
    model = load_model("mixtral-8x7b")
    if capacity:
        model = model.model_copy(update={"expert_capacity": capacity})
    return dataclasses.replace(_tiny(), model=model)


# -- 1. the expert shards' TP gather of the routed tokens -------------------------------------


def test_moe_expert_tp_collectives_move_top_k_times_the_tokens() -> None:
    """Megatron-core's MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/
    token_dispatcher.py): after the EP all-to-all, ``token_permutation`` all-gathers the
    routed tokens over the TP group (``gather_from_sequence_parallel_region``) and
    ``token_unpermutation`` reduce-scatters the experts' output before the all-to-all back
    (``reduce_scatter_to_sequence_parallel_region``). Each token is routed to ``k`` experts, so
    these move ``k * A`` (the all-to-all's ``k x`` tokens of every TP rank). The expert linears
    run with ``explicit_expert_comm`` (no collective of their own, the gathered input saved
    whole): no backward re-gather, nothing overlapped with their GEMMs. Backward: all-gather of
    the output gradient, reduce-scatter of the input gradient, ``k * A`` each (Megatron-LM runs
    MoE with TP only under sequence parallelism: `test_moe_with_tp_needs_sequence_parallelism`).
    The attention half keeps the dense pattern of ``A``. It was charged at ``A`` for both
    halves."""
    inputs = _mixtral()
    run = RunConfig(tp=2, pp=1, cp=1, dp=0, ep=2, micro_batch_size=1, sequence_parallel=True)
    lay = layout_of(inputs, run)
    a = activation_bytes(inputs, lay)
    assert a == SEQ * 4096 * 2  # b s h bytes (bf16)
    k = inputs.model.experts_per_token

    def c(op: str, nbytes: float) -> float:
        return collective_s(op, nbytes, lay.tp_group, inputs.cluster)  # type: ignore[arg-type]

    lc = layer_comm(inputs, lay)
    attn_fw = c("all-gather", a) + c("reduce-scatter", a)
    attn_bw = 2 * c("all-gather", a) + c("reduce-scatter", a)  # + the qkv input re-gather
    moe = c("all-gather", k * a) + c("reduce-scatter", k * a)
    assert moe > c("all-gather", a) > 0
    assert lc.tp_fw_s == pytest.approx(attn_fw + moe, rel=1e-12)
    assert lc.tp_bw_s == pytest.approx(attn_bw + moe, rel=1e-12)

    # with async TP overlap only the attention's column-parallel linear (qkv) hides anything
    table = latency_table(inputs, [run])
    bt = block_times(shard_kernels(inputs, run), table, run)
    assert len(bt.col_dgrad_s) == len(bt.col_wgrad_s) == 1
    d, w = bt.col_dgrad_s[0], bt.col_wgrad_s[0]
    ag, rs = c("all-gather", a), c("reduce-scatter", a)
    want = ag + max(0.0, ag - d) + max(0.0, rs - w) + moe
    assert tp_bw_exposed_s(bt, lc, run) == pytest.approx(want, rel=1e-12)
    blocking = run.model_copy(update={"tp_comm_overlap": False})
    assert tp_bw_exposed_s(bt, lc, blocking) == pytest.approx(lc.tp_bw_s, rel=1e-12)


@pytest.mark.parametrize("ep", [1, 2])
def test_moe_with_tp_needs_sequence_parallelism(ep: int) -> None:
    """Megatron-LM asserts "When using MoE and tensor parallelism, sequence parallelism must be
    used" (megatron/training/arguments.py); such a layout was simulated and could be ranked."""
    inputs = _mixtral()
    run = RunConfig(tp=2, pp=1, cp=1, dp=0, ep=ep, micro_batch_size=1)
    with pytest.raises(ConfigError, match=r"run\.sequence_parallel: must be true for a MoE"):
        layout_of(inputs, run)
    layout_of(inputs, run.model_copy(update={"sequence_parallel": True}))
    layout_of(inputs, run.model_copy(update={"tp": 1}))


def test_a_dense_layer_keeps_its_tp_collectives() -> None:
    """A dense model at the same layout: two linear pairs of ``A`` each, as before."""
    inputs = dataclasses.replace(_tiny(), model=load_model("llama3-8b"))
    run = RunConfig(tp=2, pp=1, cp=1, dp=0, micro_batch_size=1, sequence_parallel=True)
    lay = layout_of(inputs, run)
    lc = layer_comm(inputs, lay)
    assert lc.tp_fw_s == pytest.approx(2 * (lc.tp_ag_s + lc.tp_rs_s))
    assert lc.tp_bw_s == pytest.approx(4 * lc.tp_ag_s + 2 * lc.tp_rs_s)


# -- 2. expert capacity -------------------------------------------------------------------------


def _expert_rows(inputs: SimInputs, run: RunConfig) -> set[int]:
    """Rows of the experts' gate/up GEMM (h -> 2 f / tp) on one shard."""
    m = inputs.model
    up = 2 * m.ffn_hidden_size // run.tp
    layer = shard_kernels(inputs, run).layer_fw
    return {
        k.dims[1]
        for k, _ in layer
        if k.family is OpFamily.LINEAR and k.dims[2:] == (m.hidden_size, up)
    }


@pytest.mark.parametrize(
    ("b", "cp", "ep"), [(1, 1, 1), (2, 1, 1), (4, 1, 2), (2, 2, 2), (1, 2, 1), (2, 4, 4)]
)
def test_expert_capacity_scales_with_the_tokens_of_a_micro_batch(b: int, cp: int, ep: int) -> None:
    """Megatron-core's router (moe_utils.topk_softmax_with_capacity) caps each expert at
    ``get_capacity(num_tokens * topk, E, capacity_factor) = ceil(num_tokens * k / E * f)``
    with ``num_tokens`` the rank's local tokens: ``b * s / cp`` (``/ tp`` under sequence
    parallelism) of one micro-batch, so the cap grows with the micro-batch and shrinks with cp.
    A per-sequence cap of ``C`` tokens (HF Switch's ``expert_capacity``) is the factor
    ``f = C E / (s k)``. After the all-to-all a local expert holds the capped rows of ``ep``
    source ranks: ``min(T k / (E/ep), f T k / (E/ep)) = min(T k ep / E, C ep b / cp)`` rows,
    ``T = b s / cp``. The Megatron inventory capped a whole micro-batch at ``C`` (b sequences
    shared one sequence's cap) and ignored cp (each rank's quarter of a sequence kept the whole
    sequence's cap)."""
    cap = 512  # f = 512 * 8 / (4096 * 2) = 0.5: binds
    inputs = _mixtral(cap)
    m = inputs.model
    run = RunConfig(tp=1, pp=1, cp=cp, dp=0, ep=ep, micro_batch_size=b)
    tokens = b * SEQ // cp
    balanced = tokens * m.experts_per_token * ep // m.num_experts
    want = min(balanced, cap * ep * b // cp)
    assert want == balanced // 2  # f = 0.5
    assert _expert_rows(inputs, run) == {want}
    # without a cap every routed row runs
    assert _expert_rows(_mixtral(), run) == {balanced}


# -- 3. context parallelism: causal pairs of the load-balanced ring ------------------------------


def _attention_flops(kernels: tuple[tuple[object, int], ...]) -> float:
    return sum(k.flops() * n for k, n in kernels if k.family is OpFamily.ATTENTION)  # type: ignore[attr-defined]


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_cp_rank_computes_its_share_of_causal_pairs_exactly(cp: int) -> None:
    """TransformerEngine's load-balanced ring (AttnFuncWithCPAndKVP2P): the sequence is cut
    into ``2 cp`` chunks of ``c = S / (2 cp)`` tokens and rank ``r`` holds chunks ``r`` and
    ``2 cp - 1 - r``. Step 0 is causal over its own ``2c`` tokens (``2c (2c + 1) / 2``
    pairs); each of the ``cp - 1`` other steps is unmasked: all its ``2c`` queries against the
    first half of a lower rank's K,V, or its second ``c`` queries against all ``2c`` keys of a
    higher rank, ``2 c^2`` pairs either way. Per rank: ``2c^2 + c + (cp - 1) 2 c^2 = c (S + 1)``,
    the ``S (S + 1) / 2`` causal pairs of the whole matrix over ``cp``. Forward FLOPs
    ``4 BH d`` per pair, backward ``2.5x``. The simulator charged ``cp`` causal steps of the
    local ``2c`` tokens: ``(cp - 1) c`` pairs more, and ``cp`` diagonals of tiles where one
    runs."""
    inputs = _tiny()
    run = RunConfig(tp=1, pp=1, cp=cp, dp=0, micro_batch_size=1)
    sk = shard_kernels(inputs, run)
    m = inputs.model
    bh, d = m.num_heads, m.dhead
    c = SEQ // (2 * cp)
    pairs = c * (SEQ + 1)
    assert pairs * cp == SEQ * (SEQ + 1) // 2
    fw = _attention_flops(sk.attention_fw)
    bw = _attention_flops(sk.attention_bw)
    assert len(sk.ring_fw) == len(sk.ring_bw) == (2 if cp > 1 else 0)
    fw += (cp - 1) * max((_attention_flops(r) for r in sk.ring_fw), default=0.0)
    bw += (cp - 1) * max((_attention_flops(r) for r in sk.ring_bw), default=0.0)
    assert fw == 4 * bh * d * pairs
    assert bw == 2.5 * 4 * bh * d * pairs
    if cp > 1:  # both half steps: 2 c^2 pairs, unmasked
        for r in sk.ring_fw:
            (k,) = [k for k, _ in r]
            assert k.op == "attention" and k.dims[1] * k.dims[2] == 2 * c * c
        assert {k.dims[1:3] for r in sk.ring_fw for k, _ in r} == {(2 * c, c), (c, 2 * c)}
        assert {k.op for r in sk.ring_bw for k, _ in r} == {"attention_bwd"}


@pytest.mark.parametrize("cp", [2, 8])
def test_cp_ring_steps_take_the_slower_half_step(cp: int) -> None:
    """Rank 0 runs every step ``i >= 1`` as its second half against a higher rank's K,V
    (``c x 2c``), rank ``cp - 1`` every one as its ``2c`` queries against a lower rank's first
    half (``2c x c``), the others ``r`` of one and ``cp - 1 - r`` of the other: the slowest rank,
    which sets the layer, is ``t0 + (cp - 1) max(t_A, t_B)``. The attention core of one layer
    (what a CP ring hides behind, what selective recompute re-runs) is that; the layer holds
    step 0 already."""
    inputs = _tiny()
    run = RunConfig(tp=1, pp=1, cp=cp, dp=0, micro_batch_size=1)
    table = latency_table(inputs, [run])
    sk = shard_kernels(inputs, run)
    bt = block_times(sk, table, run)

    def t(kernels: tuple[tuple[object, int], ...]) -> float:
        return sum(table[k] * n for k, n in kernels)  # type: ignore[index]

    fw = t(sk.attention_fw) + (cp - 1) * max(t(r) for r in sk.ring_fw)
    bw = t(sk.attention_bw) + (cp - 1) * max(t(r) for r in sk.ring_bw)
    assert bt.attention_fw_s == pytest.approx(fw, rel=1e-12)
    assert bt.attention_bw_s == pytest.approx(bw, rel=1e-12)
    assert bt.layer_fw_s == pytest.approx(t(sk.layer_fw) + fw - t(sk.attention_fw), rel=1e-12)
    assert bt.layer_bw_s == pytest.approx(t(sk.layer_bw) + bw - t(sk.attention_bw), rel=1e-12)


def test_non_causal_cp_steps_are_whole_blocks() -> None:
    """Without a causal mask (an encoder) every ring step is the whole ``2c x 2c`` block: the
    ``S^2 / cp`` pairs per rank."""
    inputs = dataclasses.replace(
        _tiny(), model=_tiny().model.model_copy(update={"architecture": "bert"})
    )
    cp = 4
    run = RunConfig(tp=1, pp=1, cp=cp, dp=0, micro_batch_size=1)
    sk = shard_kernels(inputs, run)
    m = inputs.model
    fw = _attention_flops(sk.attention_fw)
    fw += (cp - 1) * max(_attention_flops(r) for r in sk.ring_fw)
    assert fw == 4 * m.num_heads * m.dhead * SEQ * SEQ // cp


# -- 4. router and permutes under sequence parallelism -------------------------------------------


@pytest.mark.parametrize("sp", [False, True])
def test_router_and_permutes_run_on_a_tp_ranks_own_tokens(sp: bool) -> None:
    """Under sequence parallelism each TP rank routes and permutes its own ``s / tp`` tokens
    (Megatron-core's MoELayer runs the router on the sequence-parallel hidden states; the
    dispatcher permutes ``num_local_tokens * k`` rows before the all-to-all and unpermutes as
    many after it): router GEMM ``2 (T/tp) h E`` FLOPs, permute and unpermute copies of
    ``(T/tp) k`` rows of ``h``. Without it every TP rank routes and permutes all ``T``."""
    inputs = _mixtral()
    m = inputs.model
    tp = 2
    run = RunConfig(tp=tp, pp=1, cp=1, dp=0, ep=2, micro_batch_size=1, sequence_parallel=sp)
    layer = shard_kernels(inputs, run).layer_fw
    rows = SEQ // tp if sp else SEQ
    router = [k for k, _ in layer if k.family is OpFamily.LINEAR and k.dims[3] == m.num_experts]
    e = m.num_experts
    assert [k.flops() for k in router] == [2 * rows * m.hidden_size * e + rows * e]
    k_top, item = m.experts_per_token, ITEMSIZE_BYTES[inputs.dtype]
    permutes = [k for k, _ in layer if k.family is OpFamily.MEMORY and k.op == "copy"]
    assert [k.dims for k in permutes] == [(rows * k_top, m.hidden_size)] * 2
    assert [k.bytes() for k in permutes] == [2 * rows * k_top * m.hidden_size * item] * 2


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 2), (2, 8), (4, 4)])
def test_expert_parameters_per_gpu(tp: int, ep: int) -> None:
    """One GPU holds ``E / ep`` experts of each MoE layer, a ``1 / tp`` shard of each (expert
    tensor parallelism = tp, Megatron-core's default): Mixtral's SwiGLU experts have three
    ``h x f`` matrices and no bias, so ``3 h f E / (tp ep)`` per layer."""
    from simulator.shard_params import chunk_expert_params

    m = load_model("mixtral-8x7b")
    run = RunConfig(tp=tp, pp=1, dp=0, ep=ep, micro_batch_size=1)
    per_layer = 3 * m.hidden_size * m.ffn_hidden_size * m.num_experts / (tp * ep)
    assert chunk_expert_params(m, run, 4) == pytest.approx(4 * per_layer, rel=1e-12)
