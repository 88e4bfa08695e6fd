"""A binding expert capacity drops routed rows, and the experts save activations for the rows
they keep only, the rows the dispatcher moves (`comm.routed_share`; one function:
`moe_routing.routed_share`).

Our `moe_routing.expert_groups` drops (Megatron-core's capacity factor without
``moe_pad_expert_input_to_capacity``): an expert runs ``min(rows, C)`` rows a sequence; under
balanced routing a padded expert would run exactly ``C`` too whenever the cap binds.

Mixtral 8x7B (h 4096, f 14336, SwiGLU, 32 heads, 8 KV heads of 128, k = 2 of 8 experts), bf16,
flash attention, Megatron: per token of one layer, in units of ``h`` bytes, 10 replicated (norm
inputs, QKV and MLP inputs, masks), 5 of attention (Q 2, K V 2 x 1/4 x 2, projection input 2),
per routed copy of a token the experts' input 2 and the MLP's tensors 6 f / h = 21; a per-sequence
cap ``C`` of the ``s k / E`` rows an expert is routed keeps ``r = min(1, C E / (s k))`` of the
``k`` copies: ``10 + 5 + k r (21 + 2)`` on one GPU, ``(10 + 5 + 42 r) / t + 4 r`` on a GPU of
tp ``t`` with sequence parallelism (the routed input whole on every TP rank). They kept all k.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from forecast.kernels import Dtype
from simulator import moe_routing
from simulator.comm import routed_share
from simulator.dist_memory import layer_activation_bytes as dist_layer_bytes
from simulator.memory import layer_activation_bytes
from simulator.models import load_model
from simulator.opgraph import Workload
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import layout_of

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
SEQ = 4096
H = 4096


def _mixtral(capacity: int) -> SimInputs:
    sets = (f"model.seq_len={SEQ}", "training.global_batch_size=16")
    model = load_model("mixtral-8x7b").model_copy(update={"expert_capacity": capacity})
    return dataclasses.replace(resolve(load_scenario(TINY, overrides=sets)), model=model)


# capacity C per sequence and expert, kept share r = min(1, C x 8 / (4096 x 2))
CAPS = [(0, 1.0), (512, 0.5), (256, 0.25), (2048, 1.0)]


@pytest.mark.parametrize(("capacity", "kept"), CAPS)
@pytest.mark.parametrize("batch", [1, 2])
def test_single_gpu_experts_save_the_kept_rows(capacity: int, kept: float, batch: int) -> None:
    """``s b h (15 + 2 x 23 r)`` bytes a layer (bf16): the experts' 46 units scale with r."""
    model = load_model("mixtral-8x7b").model_copy(update={"expert_capacity": capacity})
    run = Workload(batch=batch, seq=SEQ, framework="megatron", dtype=Dtype.BF16)
    assert moe_routing.routed_share(model, SEQ * batch, batch) == kept
    want = SEQ * batch * H * (15 + 2 * 23 * kept)
    assert layer_activation_bytes(model, run) == pytest.approx(want, rel=1e-12)


CASES = [(1, 1, 2, 1), (2, 1, 2, 1), (2, 2, 2, 2), (1, 2, 4, 1), (1, 1, 8, 2)]


@pytest.mark.parametrize(("tp", "cp", "ep", "b"), CASES)
@pytest.mark.parametrize(("capacity", "kept"), CAPS)
def test_distributed_experts_save_the_rows_the_dispatcher_moves(
    tp: int, cp: int, ep: int, b: int, capacity: int, kept: float
) -> None:
    """Per GPU: ``(b s / cp) h ((15 + 42 r) / t + 4 r)`` with sequence parallelism (t > 1),
    ``15 + 46 r`` at t 1, with ``r`` the share the dispatcher moves (`comm.routed_share`; under
    cp the cap of a rank's s / cp is C / cp, the same share)."""
    inputs = _mixtral(capacity)
    run = RunConfig(tp=tp, pp=1, cp=cp, dp=0, ep=ep, micro_batch_size=b, sequence_parallel=tp > 1)
    lay = layout_of(inputs, run)
    assert routed_share(inputs, lay) == kept
    tokens = b * SEQ // cp
    units = (15 + 42 * kept) / tp + 4 * kept
    assert dist_layer_bytes(inputs, lay) == pytest.approx(tokens * H * units, rel=1e-12)


def test_full_recompute_keeps_the_layer_input_and_recomputes_the_kept_rows() -> None:
    """Full recompute saves the layer input (2 / t units); the layer's working set while it is
    recomputed is the kept rows' (the same ``(15 + 42 r) / t + 4 r``)."""
    inputs = _mixtral(512)
    run = RunConfig(tp=2, pp=1, dp=0, ep=2, sequence_parallel=True, recompute="full")
    lay = layout_of(inputs, run)
    assert dist_layer_bytes(inputs, lay) == pytest.approx(SEQ * H * 2 / 2, rel=1e-12)
    working = SEQ * H * ((15 + 42 * 0.5) / 2 + 4 * 0.5)
    assert dist_layer_bytes(inputs, lay, working=True) == pytest.approx(working, rel=1e-12)
