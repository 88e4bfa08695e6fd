"""Balanced routing spreads a GPU's ``tokens x k`` routed rows over its ``local`` experts as
evenly as whole rows allow: ``tokens x k mod local`` experts run the ceiling
``ceil(tokens k / local)``, the rest the floor, and every row runs (a step waits for its
busiest expert and loses no token). The balanced branch of `moe_routing.expert_groups` floored
``tokens / sequences x k / local`` for every expert, dropping the remainder without any
capacity (Mixtral at 4,094 tokens: 8,184 of 8,188 rows ran, and the dispatcher moved 8,184).
Under expert parallelism each EP rank gets exactly ``tokens x k`` rows: the E experts' remainder
``(tokens ep k) mod E = ep x (tokens k mod local)`` falls evenly on the ep ranks.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from forecast.kernels import OpFamily
from simulator import moe_routing
from simulator.comm import routed_share
from simulator.models import load_model
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import layout_of
from simulator.stagecost import shard_kernels, shard_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
MIXTRAL = load_model("mixtral-8x7b")  # 8 experts, k = 2


@pytest.mark.parametrize("tokens", [4094, 4093, 4095, 1001, 4096])
@pytest.mark.parametrize("local", [8, 4, 2, 1])
def test_every_routed_row_runs_and_the_busiest_expert_takes_the_ceiling(
    tokens: int, local: int
) -> None:
    m = MIXTRAL.model_copy(update={"local_experts": local})
    rows = tokens * 2
    q, extra = divmod(rows, local)
    want = ((q + 1, extra), (q, local - extra)) if extra else ((q, local),)
    assert moe_routing.expert_groups(m, tokens) == want
    assert moe_routing.routed_rows(m, tokens) == rows
    assert moe_routing.expert_rows(m, tokens) == math.ceil(rows / local)
    assert moe_routing.routed_share(m, tokens) == 1.0


def test_sequences_of_a_micro_batch_spread_as_evenly_as_their_sum() -> None:
    """Two sequences of 2,047 tokens route 2 x 4,094 rows over 8 experts: 1,023.5 each, so
    four run 1,024 and four 1,023 (8,188 in all); a per-sequence cap of 511 keeps 8 x 2 x 511."""
    assert moe_routing.expert_groups(MIXTRAL, 4094, 2) == ((1024, 4), (1023, 4))
    capped = MIXTRAL.model_copy(update={"expert_capacity": 511})
    assert moe_routing.expert_groups(capped, 4094, 2) == ((1022, 8),)
    assert moe_routing.routed_rows(capped, 4094, 2) == 8 * 2 * 511


def _mixtral(seq: int) -> SimInputs:
    sets = (f"model.seq_len={seq}", "training.global_batch_size=16")
    return dataclasses.replace(resolve(load_scenario(TINY, overrides=sets)), model=MIXTRAL)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_layer_runs_and_dispatches_every_row_at_an_uneven_sequence(ep: int) -> None:
    """Seq 4,094 at tp 1: the experts' first GEMMs of one GPU run ``4,094 x 2`` rows in all
    (8,184 at ep 1), the dispatcher moves all of them (share 1, was 8,184 / 8,188) and the
    busiest expert runs ``ceil(8,188 / (8 / ep))``."""
    inputs = _mixtral(4094)
    run = RunConfig(tp=1, pp=1, dp=0, ep=ep, micro_batch_size=1)
    lay = layout_of(inputs, run)
    assert routed_share(inputs, lay) == 1.0
    local = 8 // ep
    shard = shard_model(inputs.model, run)
    assert moe_routing.expert_rows(shard, 4094) == math.ceil(8188 / local)
    gemms = [
        (k.dims, n)  # (batch, rows, h, 2 f): the fused gate-and-up GEMM of each expert
        for k, n in shard_kernels(inputs, run).layer_fw
        if k.family is OpFamily.LINEAR and k.dims[-1] == 2 * 14336
    ]
    assert sum(dims[1] * n for dims, n in gemms) == 8188
    assert max(dims[1] for dims, _ in gemms) == math.ceil(8188 / local)
