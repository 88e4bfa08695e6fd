"""Pipeline point-to-point traffic against Megatron-LM's closed forms (audit, no change).

Per micro-batch and stage boundary the forward sends the ``s/cp x b x h`` hidden states in the
activation dtype (bf16 under fp8 training, else the workload's) and the backward their gradient,
the same bytes. Each TP rank sends ``1 / tp`` of them: under sequence parallelism the tensor
is already split; without it Megatron's scatter-gather optimisation splits it and the receiving
TP group all-gathers the whole. Interleaving (``v`` chunks a stage) crosses ``pp * v - 1``
boundaries, the wrap from the last stage to the first included, each way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.comm import collective_s, layer_comm
from simulator.execgraph import build_exec_graph
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import latency_table, layout_of
from simulator.stepcosts import step_costs

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"
SEQ, HIDDEN, MBS = 128, 256, 2


def _inputs(dtype: str) -> SimInputs:
    sets = ["model.n_layers=4", f"training.dtype={dtype}"]
    if dtype == "fp8":
        sets.append("cluster.gpu=h100-sxm5-80gb")
    return resolve(load_scenario(TINY, overrides=sets))


# fp32 runs unfused attention, and context parallelism needs flash attention (a ConfigError).
_CASES = [
    (dtype, itemsize, tp, cp, sp)
    for dtype, itemsize in [("bf16", 2), ("fp32", 4), ("fp8", 2)]
    for tp, cp, sp in [(1, 1, False), (2, 1, False), (2, 1, True), (2, 2, True)]
    if not (dtype == "fp32" and cp > 1)
]


@pytest.mark.parametrize(("dtype", "itemsize", "tp", "cp", "sp"), _CASES)
def test_one_hop_moves_the_hidden_states_split_over_tp(
    dtype: str, itemsize: int, tp: int, cp: int, sp: bool
) -> None:
    inputs = _inputs(dtype)
    run = RunConfig(
        tp=tp, pp=2, cp=cp, dp=4 // (tp * cp), micro_batch_size=MBS, sequence_parallel=sp
    )
    layout = layout_of(inputs, run)
    a = MBS * SEQ // cp * HIDDEN * itemsize  # one CP rank's hidden states
    send = max(collective_s("send-recv", a / tp, hop, inputs.cluster) for hop in layout.pp_hops)
    gather = 0.0 if sp else collective_s("all-gather", a, layout.tp_group, inputs.cluster)
    assert layer_comm(inputs, layout).pp_hop_s == pytest.approx(send + gather, rel=1e-12)


@pytest.mark.parametrize(("pp", "v"), [(2, 1), (2, 2), (4, 1), (2, 4), (4, 2)])
def test_every_micro_batch_crosses_each_virtual_boundary_once_each_way(pp: int, v: int) -> None:
    inputs = resolve(load_scenario(TINY, overrides=["model.n_layers=8"]))
    schedule = "1f1b-interleaved" if v > 1 else "1f1b"
    run = RunConfig(
        tp=1, pp=pp, dp=8 // pp, micro_batch_size=1, schedule=schedule, virtual_stages=v
    )
    layout = layout_of(inputs, run)
    graph = build_exec_graph(step_costs(inputs, layout, latency_table(inputs, [run]))).graph
    hops = [e for e in graph.edges.values() if e.get("comm") == "pp"]
    assert len(hops) == 2 * layout.num_micro_batches * (pp * v - 1)
    if v > 1:
        assert layout.pp_hops[-1] == ((pp - 1) * 8 // pp, 0)  # the wrap is priced too
