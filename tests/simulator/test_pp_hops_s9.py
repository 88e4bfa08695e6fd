"""Pipeline hops are priced at the slowest stage boundary, and TP groups never straddle nodes.

The tiny scenario has 2 nodes x 4 GPUs. With tp*cp*dp = 2 the stages start every 2 ranks, so
rank 0's first boundary (0 -> 2) stays inside node 0 while the next one (2 -> 4) crosses to
node 1: the hop must cost the cross-node send, not the NVLink one rank 0 happens to see.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.comm import collective_s, layer_comm
from simulator.errors import ConfigError
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import layout_of

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"


def _inputs(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=["model.n_layers=4", *sets]))


def test_hops_list_every_boundary_and_the_interleaved_wrap() -> None:
    inputs = _inputs()
    plain = layout_of(inputs, RunConfig(tp=1, pp=4, dp=2, micro_batch_size=1))
    assert plain.pp_hops == ((0, 2), (2, 4), (4, 6))
    wrap = layout_of(
        inputs,
        RunConfig(
            tp=1, pp=2, dp=4, micro_batch_size=1, schedule="1f1b-interleaved", virtual_stages=2
        ),
    )
    assert wrap.pp_hops == ((0, 4), (4, 0))
    assert layout_of(inputs, RunConfig(tp=2, pp=1, dp=4, micro_batch_size=1)).pp_hops == ()


def test_the_hop_costs_the_cross_node_boundary() -> None:
    inputs = _inputs()
    run = RunConfig(tp=1, pp=4, dp=2, micro_batch_size=1)  # tp 1: no TP gather on the hop
    layout = layout_of(inputs, run)
    a = 1 * 128 * 256 * 2  # micro-batch x seq x hidden x bf16
    within = collective_s("send-recv", a, (0, 2), inputs.cluster)
    across = collective_s("send-recv", a, (2, 4), inputs.cluster)
    assert across > within  # the premise: node 0 -> node 1 is the slower link
    assert layer_comm(inputs, layout).pp_hop_s == pytest.approx(across)


def test_a_tp_group_straddling_two_nodes_is_refused() -> None:
    inputs = _inputs(
        "model.n_heads=6",
        "model.hidden_size=192",
        "cluster.num_gpus=12",
        "training.global_batch_size=24",
    )
    with pytest.raises(ConfigError, match=r"run\.tp: must divide the 4 GPUs of a node"):
        layout_of(inputs, RunConfig(tp=3, pp=1, dp=4, micro_batch_size=1))
    layout_of(inputs, RunConfig(tp=2, pp=1, dp=6, micro_batch_size=1))  # divides 4: fine


def test_dp_and_cp_groups_priced_are_the_widest() -> None:
    """12 GPUs on 4-GPU nodes, tp 1, pp 4, dp 3: stage 0's DP group (0,1,2) stays in node 0
    but stage 1's (3,4,5) spans two nodes; the group priced is a two-node one (rank 0's, the
    fastest, priced every stage). Regular layouts keep rank 0's groups."""
    sets = ("cluster.num_gpus=12", "training.global_batch_size=24")
    inputs = _inputs(*sets)
    layout = layout_of(inputs, RunConfig(tp=1, pp=4, dp=3, micro_batch_size=1))
    nodes = {r // 4 for r in layout.dp_group}
    assert len(layout.dp_group) == 3 and len(nodes) == 2
    a = 1e8
    widest = collective_s("all-reduce", a, layout.dp_group, inputs.cluster)
    assert widest > collective_s("all-reduce", a, (0, 1, 2), inputs.cluster)
    cp3 = layout_of(_inputs(*sets, "model.seq_len=126"), RunConfig(tp=1, pp=1, cp=3, dp=4))
    assert len({r // 4 for r in cp3.cp_group}) == 2
    regular = layout_of(_inputs(), RunConfig(tp=1, pp=2, dp=4, micro_batch_size=1))
    assert regular.dp_group == (0, 1, 2, 3) and regular.cp_group == (0,)


def test_screen_and_simulation_price_the_same_widest_groups() -> None:
    from simulator.screen import screen
    from simulator.screen_cache import ScreenCache
    from simulator.simulate import latency_table, simulate

    inputs = _inputs("cluster.num_gpus=12", "training.global_batch_size=24")
    run = RunConfig(tp=1, pp=4, dp=3, micro_batch_size=1, zero_stage=1)
    table = latency_table(inputs, [run])
    full = simulate(inputs, run, table)
    est = screen(ScreenCache(inputs, table), run)
    assert est.memory.total_bytes / 2**30 == pytest.approx(full.memory_gib_per_gpu, rel=1e-9)
    assert est.iteration_s == pytest.approx(full.iteration_s, rel=0.15)
