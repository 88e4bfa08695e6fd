"""Each context-parallel schedule prices its attention core with its own kernels
(`context_parallel.schedule_core`): the p2p ring's causal step 0 and ``cp - 1`` half steps,
``all_gather``'s two query halves against their K,V prefixes (TransformerEngine's
``AttnFuncWithCPAndKVAllGather``), ``a2a``'s one causal kernel over the whole sequence on
``heads / cp`` (``AttnFuncWithCPAndQKVOA2A``); and ``all_gather``'s whole-sequence K,V
temporaries are memory of their own.

The tiny GPT (h = 256, 8 heads of 32, seq ``S`` = 128, bf16) with 4 key/value heads, at
micro-batch 2 and tp 2: a TP rank runs ``b heads / tp = 8`` (batch x head) rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forecast.kernels import CAUSAL_ATTENTION_OPS, Dtype, KernelSpec, OpFamily
from simulator.cli import main
from simulator.context_parallel import Counted, gathered_kv_units, schedule_core
from simulator.dist_memory import stage_memory
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, simulate
from simulator.stagecost import ShardKernels, block_times, shard_kernels
from simulator.stepcosts import stage_params

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
S, D, BH = 128, 32, 2 * 8 // 2  # sequence, head dim, b * heads / tp
ATTN = OpFamily.ATTENTION


def _inputs() -> SimInputs:
    return resolve(
        load_scenario(TINY, overrides=["model.n_kv_heads=4", "training.global_batch_size=8"])
    )


def _run(comm: str, cp: int, **fields: object) -> RunConfig:
    base: dict[str, object] = {"tp": 2, "cp": cp, "pp": 1, "dp": 4 // cp, "micro_batch_size": 2}
    return RunConfig.model_validate({**base, "cp_comm_type": comm, **fields})


def _attention(kernels: Counted) -> list[tuple[tuple[int, ...], str]]:
    return [(k.dims, k.op) for k, n in kernels for _ in range(n) if k.family is ATTN]


def _flops(kernels: Counted) -> float:
    return sum(k.flops() * n for k, n in kernels if k.family is ATTN)


def _core_flops(sk: ShardKernels, cp: int, *, backward: bool) -> list[float]:
    """Attention FLOPs a rank runs in one layer, one figure per alternative (per rank kind)."""
    if sk.core_fw:
        return [_flops(c) for c in (sk.core_bw if backward else sk.core_fw)]
    step0 = _flops(sk.attention_bw if backward else sk.attention_fw)
    return [step0 + (cp - 1) * _flops(r) for r in (sk.ring_bw if backward else sk.ring_fw)]


def test_a2a_runs_one_causal_kernel_over_the_whole_sequence_on_heads_over_cp() -> None:
    """(b heads / (tp cp), S, S, d), forward and backward, and nothing of the ring."""
    sk = shard_kernels(_inputs(), _run("a2a", 2))
    assert [_attention(c) for c in sk.core_fw] == [[((BH // 2, S, S, D), "attention_causal")]]
    assert [_attention(c) for c in sk.core_bw] == [[((BH // 2, S, S, D), "attention_causal_bwd")]]
    assert sk.ring_fw == sk.ring_bw == sk.attention_fw == sk.attention_bw == ()
    assert _attention(sk.layer_fw) == _attention(sk.layer_bw) == []  # step 0 left out


@pytest.mark.parametrize("cp", [2, 4])
def test_all_gather_runs_each_query_half_against_its_k_v_prefix(cp: int) -> None:
    """Rank r: chunks r and 2cp - 1 - r of 2cp, S/(2cp) queries each against keys
    [0, (c + 1) S/(2cp)), one alternative a rank."""
    sk = shard_kernels(_inputs(), _run("all_gather", cp))
    n = S // (2 * cp)
    for core, op in ((sk.core_fw, "attention_causal"), (sk.core_bw, "attention_causal_bwd")):
        want = {
            tuple(sorted(((BH, n, (c + 1) * n, D), op) for c in (r, 2 * cp - 1 - r)))
            for r in range(cp)
        }
        assert {tuple(sorted(_attention(c))) for c in core} == want
        assert len(core) == cp
    assert sk.ring_fw == sk.attention_fw == ()
    assert _attention(sk.layer_fw) == []


def test_p2p_keeps_its_ring_and_its_step_0_in_the_layer() -> None:
    sk = shard_kernels(_inputs(), _run("p2p", 2))
    assert sk.core_fw == sk.core_bw == ()
    assert _attention(sk.attention_fw) == [((BH, S // 2, S // 2, D), "attention_causal")]
    assert _attention(sk.attention_fw)[0] in _attention(sk.layer_fw)
    assert len(sk.ring_fw) == 2


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("backward", [False, True])
def test_every_schedule_runs_the_causal_pairs_over_cp_on_every_rank(
    cp: int, backward: bool
) -> None:
    """Each rank of each schedule runs S (S + 1) / (2 cp) causal pairs a (batch x head) row,
    exactly: 2 matmuls of 2 FLOPs a pair and head-dim element forward, 5 backward."""
    inputs = _inputs()
    matmuls = 5 if backward else 2
    want = 2 * matmuls * BH * D * S * (S + 1) / (2 * cp)
    for comm in ("p2p", "all_gather", "a2a"):
        if comm == "a2a" and cp == 4:  # 2 kv heads a TP rank: a2a cannot split them over 4
            continue
        per_rank = _core_flops(shard_kernels(inputs, _run(comm, cp)), cp, backward=backward)
        assert per_rank, comm
        assert per_rank == pytest.approx([want] * len(per_rank), rel=1e-12), comm


@pytest.mark.parametrize("comm", ["all_gather", "a2a"])
def test_block_times_price_the_schedule_s_own_core_on_the_slowest_rank(comm: str) -> None:
    """The core is the slowest alternative's summed forecast; the layer is the rest of its
    kernels plus that core."""
    inputs, run = _inputs(), _run(comm, 2)
    table = latency_table(inputs, [run])
    sk = shard_kernels(inputs, run)
    bt = block_times(sk, table, run)
    core_fw = max(sum(table[k] * n for k, n in c) for c in sk.core_fw)
    core_bw = max(sum(table[k] * n for k, n in c) for c in sk.core_bw)
    assert bt.attention_fw_s == core_fw
    assert bt.attention_bw_s == core_bw
    assert bt.layer_fw_s == pytest.approx(sum(table[k] * n for k, n in sk.layer_fw) + core_fw)
    assert bt.layer_bw_s == pytest.approx(sum(table[k] * n for k, n in sk.layer_bw) + core_bw)


def test_a2a_core_is_not_the_ring_s() -> None:
    """Before each schedule had its own core, a2a's was the ring's step 0 plus its half steps."""
    inputs = _inputs()
    runs = [_run("p2p", 2), _run("a2a", 2)]
    table = latency_table(inputs, runs)
    ring, a2a = (block_times(shard_kernels(inputs, r), table, r) for r in runs)
    whole = KernelSpec(ATTN, (BH // 2, S, S, D), Dtype.BF16, "attention_causal")
    assert a2a.attention_fw_s == table[whole]
    assert a2a.attention_fw_s != ring.attention_fw_s


def test_non_causal_cores() -> None:
    """Without a causal mask all_gather runs both query halves against all S keys (every rank
    alike: one alternative), a2a its one kernel unmasked; other kernels of the core are kept."""
    cp, half = 4, S // 8
    fw = KernelSpec(ATTN, (BH, S // cp, S // cp, D), Dtype.BF16, "attention")
    add = KernelSpec(OpFamily.ELEMENTWISE, (4, 4), Dtype.BF16, "add")
    step0: Counted = ((fw, 1), (add, 1))
    gathered = schedule_core("all_gather", step0, cp)
    assert len(gathered) == 1
    assert _attention(gathered[0]) == [((BH, half, S, D), "attention")] * 2
    assert (add, 1) in gathered[0]
    (ulysses,) = schedule_core("a2a", step0, cp)
    assert _attention(ulysses) == [((BH // cp, S, S, D), "attention")]
    assert not any(k.op in CAUSAL_ATTENTION_OPS for c in (*gathered, ulysses) for k, _ in c)
    assert schedule_core("p2p", step0, cp) == schedule_core("a2a", step0, 1) == ()


def test_all_gather_holds_its_whole_sequence_k_v_temporaries() -> None:
    """One layer's backward at its peak: the re-gathered K and V, the whole-sequence dK and dV,
    each query half's dK, dV over its prefix (S + S/(2cp) keys in all) and the reorder copy of
    dK before the reduce-scatter: (3.5 + 1/(2cp)) x the whole sequence's K and V on a TP rank,
    ``2 b S kv_heads dhead / tp`` bf16 elements; counted once, not per micro-batch in flight."""
    inputs = _inputs()
    kv_bytes = 2 * 2 * S * 4 * D / 2 * 2  # 2 b S kv_heads dhead / tp elements, 2 B each
    for cp in (2, 4):
        other = {}
        for comm in ("p2p", "all_gather"):
            run = _run(comm, cp)
            layout = layout_of(inputs, run)
            params = stage_params(inputs, layout)[0]
            other[comm] = stage_memory(inputs, layout, 0, params, in_flight=1).other_bytes
        want = (3.5 + 1 / (2 * cp)) * kv_bytes
        assert other["all_gather"] - other["p2p"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("cp", "causal", "want"), [(2, True, 3.75), (4, True, 3.625)])
def test_gathered_kv_units_closed_form(cp: int, causal: bool, want: float) -> None:
    """Causal: each query half's dK, dV spans its prefix, ``S + S/(2cp)`` keys for the two."""
    assert gathered_kv_units("all_gather", cp, causal=causal) == want


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_without_a_causal_mask_each_query_half_s_dk_dv_spans_the_whole_sequence(cp: int) -> None:
    """BERT's encoder attends both ways: each of a rank's two query halves runs against all S
    keys, so its per-half dK, dV are whole-sequence sized (2 units, not (2cp + 1)/(2cp))."""
    causal = gathered_kv_units("all_gather", cp)
    both_ways = gathered_kv_units("all_gather", cp, causal=False)
    assert both_ways - causal == pytest.approx(2.0 - (2 * cp + 1) / (2 * cp), rel=1e-15)
    assert gathered_kv_units("p2p", cp, causal=False) == 0.0


def test_one_screen_cache_keeps_each_schedule_s_core() -> None:
    """The screen memoises block times per shard shape: the schedule is part of it."""
    inputs = _inputs()
    runs = [_run(c, 2, overlap_grad_reduce=False) for c in ("all_gather", "a2a", "p2p")]
    table = latency_table(inputs, runs)
    shared = ScreenCache(inputs, table)
    for run in runs:
        assert screen(shared, run).iteration_s == pytest.approx(
            simulate(inputs, run, table).iteration_s, rel=1e-12
        )


@pytest.mark.parametrize(("seq_len", "code"), [(130, 2), (132, 0)])
def test_cp_needs_a_sequence_of_whole_load_balanced_chunks(
    seq_len: int, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron cuts the sequence into ``2 cp`` chunks (rank r keeps r and 2cp-1-r), so at cp 2
    a sequence of 130 (divisible by cp, not by 2 cp) is refused naming run.cp; 132 runs."""
    sets = ["run.cp=2", "run.pp=1", f"model.seq_len={seq_len}"]
    argv = ["simulate", "tiny-gpt-8gpu", *(a for s in sets for a in ("--set", s))]
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    if code:
        assert err.count("\n") == 0 and err.startswith("tilesim: error: run.cp:")
        assert "multiple of 2*cp" in err
