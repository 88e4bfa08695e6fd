"""Context parallelism's communication types (``run.cp_comm_type``, Megatron-LM's
``--cp-comm-type``): the p2p ring (default, sends hidden behind the attention steps), K,V
all-gather (TransformerEngine's ``AttnFuncWithCPAndKVAllGather``: exposed) and Ulysses
all-to-all (``AttnFuncWithCPAndQKVOA2A``: exposed, heads split over cp).

Closed forms on the tiny GPT (h = 256, 8 heads of 32, seq 128) at micro-batch 2, tp 2, cp 2,
bf16, with 4 key/value heads: a rank's own Q is ``2 x 64 x 4 x 32 x 2 B = 32 KiB``, its own K
(and V) ``2 x 64 x 2 x 32 x 2 B = 16 KiB``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.comm import collective_s, layer_comm
from simulator.context_parallel import blocking_collectives
from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, simulate
from simulator.space import enumerate_space
from simulator.stepcosts import step_costs
from tests.support import refused

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
Q, K = 2 * 64 * 4 * 32 * 2, 2 * 64 * 2 * 32 * 2  # bytes of a rank's own Q; of its own K


def _inputs(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=["model.n_kv_heads=4", *sets]))


def _run(comm: str, **fields: object) -> RunConfig:
    base: dict[str, object] = {"tp": 2, "cp": 2, "pp": 1, "dp": 2, "micro_batch_size": 2}
    return RunConfig.model_validate({**base, "cp_comm_type": comm, **fields})


def test_all_gather_gathers_k_and_v_twice_and_scatters_their_gradients() -> None:
    fw, bw = blocking_collectives("all_gather", 2, Q, 2 * K)
    gather, scatter = ("all-gather", 2 * K), ("reduce-scatter", 2 * K)  # S: the whole sequence
    assert fw == (gather, gather)
    assert bw == (gather, gather, scatter, scatter)


def test_a2a_moves_q_k_v_and_the_output_each_way() -> None:
    fw, bw = blocking_collectives("a2a", 2, Q, 2 * K)
    q, k = ("all-to-all", Q), ("all-to-all", K)
    assert fw == (q, k, k, q)  # Q, K, V to a head split, then the output back
    assert bw == (q, q, q, k, k)  # output and its gradient, then dQ, dK, dV
    assert blocking_collectives("p2p", 2, Q, 2 * K) == ((), ())
    assert blocking_collectives("a2a", 1, Q, 2 * K) == ((), ())


@pytest.mark.parametrize("comm", ["all_gather", "a2a"])
def test_layer_comm_prices_them_over_the_cp_group_and_drops_the_ring(comm: str) -> None:
    inputs = _inputs()
    layout = layout_of(inputs, _run(comm))
    lc = layer_comm(inputs, layout)
    group, cl = layout.cp_group, inputs.cluster
    fw, bw = blocking_collectives(comm, 2, Q, 2 * K)
    assert lc.cp_fw_s == pytest.approx(sum(collective_s(op, n, group, cl) for op, n in fw))
    assert lc.cp_bw_s == pytest.approx(sum(collective_s(op, n, group, cl) for op, n in bw))
    assert lc.cp_fw_s > 0
    assert lc.cp_kv_s == lc.cp_kv_grad_s == 0.0


def test_p2p_is_the_default_and_keeps_the_ring() -> None:
    inputs = _inputs()
    assert RunConfig().cp_comm_type == "p2p"
    lc = layer_comm(inputs, layout_of(inputs, _run("p2p")))
    assert lc.cp_fw_s == lc.cp_bw_s == 0.0
    assert lc.cp_kv_s > 0


@pytest.mark.parametrize("comm", ["all_gather", "a2a"])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_every_layer_exposes_them_whole(comm: str, recompute: str) -> None:
    """Nothing hides them: each forward of a layer blocks for the forward collectives, each
    backward for the backward ones, and for the forward ones again when the attention core is
    recomputed."""
    inputs = _inputs()
    run = _run(comm, recompute=recompute)
    layout = layout_of(inputs, run)
    lc = layer_comm(inputs, layout)
    chunk = step_costs(inputs, layout, latency_table(inputs, [run])).chunks[0][0]
    layers = 2
    redo = lc.cp_fw_s if recompute != "none" else 0.0
    assert chunk.fw_cp_s == pytest.approx(layers * lc.cp_fw_s, rel=1e-12)
    assert chunk.bw_cp_s == pytest.approx(layers * (lc.cp_bw_s + redo), rel=1e-12)


@pytest.mark.parametrize("comm", ["p2p", "all_gather", "a2a"])
def test_the_screen_prices_them_as_the_simulation_does(comm: str) -> None:
    """One stage, no DP overlap: the closed form equals the simulated step."""
    inputs = _inputs()
    run = _run(comm, overlap_grad_reduce=False)
    table = latency_table(inputs, [run])
    sim = simulate(inputs, run, table)
    assert screen(ScreenCache(inputs, table), run).iteration_s == pytest.approx(
        sim.iteration_s, rel=1e-12
    )
    if comm != "p2p":
        assert sim.exposed_comm_s["cp"] > 0


def test_a2a_needs_cp_to_divide_a_tp_rank_s_heads() -> None:
    """4 kv heads over tp 2 leave 2 a TP rank: cp 4 cannot split them (TransformerEngine
    asserts it); all_gather and p2p can run it."""
    inputs = _inputs("training.global_batch_size=8")
    with pytest.raises(ConfigError, match=r"^run\.cp_comm_type: a2a .*n_kv_heads / tp = 2"):
        layout_of(inputs, _run("a2a", cp=4, dp=1))
    for comm in ("p2p", "all_gather"):
        layout_of(inputs, _run(comm, cp=4, dp=1))


def test_an_unknown_type_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"run\.cp_comm_type"):
        load_scenario(TINY, overrides=['run.cp_comm_type="a2a+p2p"'])


@pytest.mark.parametrize("value", ['"a2a+p2p"', '"a2a"'])
def test_the_cli_refuses_in_one_line_with_exit_2(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = ["run.tp=2", "run.pp=1", "run.dp=1", "run.cp=4", "model.n_kv_heads=4"]
    sets += ["training.global_batch_size=8", f"run.cp_comm_type={value}"]
    argv = ["simulate", str(TINY), *(a for s in sets for a in ("--set", s))]
    refused(argv, capsys, "run.cp_comm_type")


def test_a_sweep_can_list_cp_comm_type() -> None:
    """``[sweep] cp_comm_type`` is a layout axis: its layouts at cp 1 run as p2p (one kept,
    the others pruned as duplicates), a2a where it cannot split the heads is pruned by its
    rule, and a key names the type where it is not the default p2p."""
    sets = ["model.n_kv_heads=2", "sweep.tp=[2]", "sweep.pp=[1]", "sweep.cp=[1, 2, 4]"]
    sets += ["sweep.micro_batch_size=[1]", "sweep.schedule=['1f1b']"]
    sets += ["sweep.recompute=['none']", "sweep.world_size=[8]"]
    sets += ["sweep.cp_comm_type=['p2p', 'all_gather', 'a2a']"]
    space = enumerate_space(load_scenario(TINY, overrides=sets))
    got = sorted((p.cp, p.cp_comm_type) for p in space.points)
    # kv heads 2 over tp 2 leave 1 a TP rank: a2a cannot split it over cp 2 or 4
    assert got == [(1, "p2p"), (2, "all_gather"), (2, "p2p"), (4, "all_gather"), (4, "p2p")]
    pruned = {rule: n for rule, n, _ in space.pruned_by}
    assert pruned["duplicate"] == 2
    assert pruned["run.cp_comm_type"] == 2
    keys = {p.key("c") for p in space.points}
    assert "c/tp2-pp1-dp2-cp2-all_gather-mbs1-1f1b-v1-sp0-none-z1-do0" in keys
    assert "c/tp2-pp1-dp2-cp2-mbs1-1f1b-v1-sp0-none-z1-do0" in keys
