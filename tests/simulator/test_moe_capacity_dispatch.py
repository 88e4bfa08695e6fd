"""A binding expert capacity drops routed rows before Megatron-core's dispatcher moves them.

Megatron-core's ``MoEAlltoAllTokenDispatcher.preprocess`` (megatron/core/transformer/moe/
token_dispatcher.py): with a capacity factor and no padding, ``num_out_tokens`` is the sum of
the kept rows per expert, and the permute, the EP all-to-all (``input_splits``: the kept rows
per EP rank), the TP all-gather and the reduce-scatter back all move those rows; dropless, all
``tokens x k``. Under balanced routing a per-sequence cap ``C`` of ``s k / E`` rows an expert
(factor ``f = C E / (s k)``) keeps ``min(1, f)`` of them. The expert GEMMs already ran the
capped rows (test_moe_cp_s10); the dispatch moved every routed row.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from forecast.kernels import OpFamily
from simulator.comm import activation_bytes, collective_s, layer_comm, routed_share
from simulator.models import load_model
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import layout_of
from simulator.stagecost import shard_kernels

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
SEQ = 4096


def _mixtral(capacity: int = 0) -> SimInputs:
    """Mixtral 8x7B (8 experts, top 2) on the tiny scenario's 8 A100s, 4,096 tokens."""
    sets = (f"model.seq_len={SEQ}", "training.global_batch_size=16")
    model = load_model("mixtral-8x7b").model_copy(update={"expert_capacity": capacity})
    return dataclasses.replace(resolve(load_scenario(TINY, overrides=sets)), model=model)


CASES = [(1, 1, 2, 1), (2, 1, 2, 1), (2, 2, 2, 2), (1, 2, 4, 1), (1, 1, 8, 2)]


@pytest.mark.parametrize(("tp", "cp", "ep", "b"), CASES)
@pytest.mark.parametrize(("capacity", "share"), [(0, 1.0), (512, 0.5), (2048, 1.0), (256, 0.25)])
def test_dispatch_moves_the_rows_the_capacity_keeps(
    tp: int, cp: int, ep: int, b: int, capacity: int, share: float
) -> None:
    """Per MoE layer and micro-batch, forward: 2 all-to-alls of ``b s/cp h k x 2 bytes x
    min(1, f) / tp`` over the EP group, and (tp > 1) a TP all-gather and reduce-scatter of
    ``tp`` times that; ``f = C x 8 / (4096 x 2)``: 0.5 at C = 512, 2 at 2048 (no drop)."""
    inputs = _mixtral(capacity)
    m = inputs.model
    run = RunConfig(tp=tp, pp=1, cp=cp, dp=0, ep=ep, micro_batch_size=b, sequence_parallel=tp > 1)
    lay = layout_of(inputs, run)
    a = b * SEQ // cp * m.hidden_size * 2  # bf16
    assert activation_bytes(inputs, lay) == a
    assert routed_share(inputs, lay) == share
    kept = a * m.experts_per_token * share
    lc = layer_comm(inputs, lay)
    a2a = collective_s("all-to-all", kept / tp, lay.ep_group, inputs.cluster)
    assert lc.ep_fw_s == lc.ep_bw_s == 2 * a2a
    tp_moe = collective_s("all-gather", kept, lay.tp_group, inputs.cluster)
    tp_moe += collective_s("reduce-scatter", kept, lay.tp_group, inputs.cluster)
    assert lc.tp_moe_s == (tp_moe if tp > 1 else 0.0)


@pytest.mark.parametrize(("tp", "cp", "ep", "b"), CASES)
@pytest.mark.parametrize(("capacity", "share"), [(0, 1.0), (512, 0.5), (256, 0.25)])
def test_permutes_move_the_kept_rows_and_the_experts_run_them(
    tp: int, cp: int, ep: int, b: int, capacity: int, share: float
) -> None:
    """The permute and unpermute of one TP rank copy its own ``b s / (cp tp) x k x min(1, f)``
    rows (they copied all ``x k``), the same rows the shard's ``8 / ep`` experts run after the
    TP gather: ``tp`` times as many, ``b s / cp x k x min(1, f) / (8 / ep)`` each."""
    inputs = _mixtral(capacity)
    m = inputs.model
    run = RunConfig(tp=tp, pp=1, cp=cp, dp=0, ep=ep, micro_batch_size=b, sequence_parallel=tp > 1)
    kept = int(b * SEQ // cp * m.experts_per_token * share)
    layer = shard_kernels(inputs, run).layer_fw
    permutes = [k for k, _ in layer if k.family is OpFamily.MEMORY and k.op == "copy"]
    assert [k.dims for k in permutes] == [(kept // tp, m.hidden_size)] * 2
    local = m.num_experts // ep
    up = 2 * m.ffn_hidden_size // tp
    experts = [
        (k.dims[1], n)
        for k, n in layer
        if k.family is OpFamily.LINEAR and k.dims[2:] == (m.hidden_size, up)
    ]
    assert experts == [(kept // local, 1)] * local
