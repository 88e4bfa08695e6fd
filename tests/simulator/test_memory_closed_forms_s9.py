"""Per-GPU memory of a distributed step against the published closed forms, on an 8-layer
GPT (h = 256, a = 8, s = 128, v = 1024, ffn = 4h) small enough to work every term by hand:
Korthikanti et al. 2022 (activations, 1F1B and interleaved in-flight counts), Megatron-LM's
bytes per parameter (ZeRO-style sharding of the optimizer state), and the loss's fp32 softmax
the last stage keeps per micro-batch in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.dist_memory import layer_activation_bytes, stage_memory
from simulator.errors import ConfigError
from simulator.memory import RESERVED_BYTES
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.schedules import in_flight, stage_orders
from simulator.screen import _memory
from simulator.screen_cache import ScreenCache
from simulator.simulate import layout_of, peak_memory
from simulator.stepcosts import stage_params

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
S, H, A, V, LAYERS = 128, 256, 8, 1024, 8


def _inputs(gpus: int, *sets: str) -> SimInputs:
    base = ("model.n_layers=8", f"cluster.num_gpus={gpus}", "training.global_batch_size=32")
    return resolve(load_scenario(TINY, overrides=(*base, *sets)))


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_layer_activations_are_korthikanti(tp: int, sp: bool, recompute: str) -> None:
    """Eq. 2 and section 4 in bf16, unfused attention (the 5as/h score term present)."""
    inputs = _inputs(tp, "training.attention='unfused'")
    run = RunConfig(tp=tp, micro_batch_size=2, sequence_parallel=sp, recompute=recompute)  # type: ignore[arg-type]
    sbh, scores = S * 2 * H, 5 * A * S / H
    if recompute == "full":
        want = 2 * sbh / (tp if sp else 1)
    elif sp:
        want = sbh / tp * (34 + (scores if recompute == "none" else 0))
    else:
        want = sbh * (10 + 24 / tp + (scores / tp if recompute == "none" else 0))
    assert layer_activation_bytes(inputs, layout_of(inputs, run)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("schedule", "v", "factor"),
    [("1f1b", 1, 4), ("1f1b-interleaved", 2, 4 * (1 + (4 - 1) / (4 * 2)))],
)
def test_first_stage_holds_p_micro_batches_times_the_interleaving_factor(
    schedule: str, v: int, factor: float
) -> None:
    """1F1B: p = 4 micro-batches of the stage's L/p layers; interleaved: p(1 + (p-1)/(pv))
    micro-batches' worth (11 chunks of L/(pv) layers at p = 4, v = 2)."""
    inputs = _inputs(4)
    run = RunConfig(pp=4, micro_batch_size=2, schedule=schedule, virtual_stages=v)  # type: ignore[arg-type]
    layout = layout_of(inputs, run)
    per_layer = layer_activation_bytes(inputs, layout)
    first = _memory(ScreenCache(inputs, {}), layout, stage_params(inputs, layout))
    assert first == peak_memory(inputs, layout)
    assert first.stage == 0
    assert first.activations_bytes == pytest.approx(factor * LAYERS / 4 * per_layer, rel=1e-12)


@pytest.mark.parametrize(
    ("dtype", "zero", "dist_opt", "weights", "grads", "optim"),
    [
        ("bf16", 0, False, 2, 4, 12),  # Megatron: bf16 weights, fp32 main grads, 12 B Adam
        ("bf16", 0, True, 2, 4, 12 / 4),  # distributed optimizer: 6 + 12/d
        ("bf16", 2, False, 2, 4 / 4, 12 / 4),  # ZeRO-2: 2 + 16/d
        ("fp16", 1, False, 2, 2, 12 / 4),  # ZeRO-1, K = 12: 2 + 2 + 12/d
        ("fp32", 0, True, 4, 4, 8 / 4),  # fp32: 8 + 8/d
    ],
)
def test_model_state_bytes_per_parameter(
    dtype: str, zero: int, dist_opt: bool, weights: float, grads: float, optim: float
) -> None:
    inputs = _inputs(4, f"training.dtype='{dtype}'")
    run = RunConfig(dp=4, zero_stage=zero, distributed_optimizer=dist_opt)
    layout = layout_of(inputs, run)
    n = stage_params(inputs, layout)[0]
    mem = peak_memory(inputs, layout)
    assert mem.weights_bytes == pytest.approx(weights * n, rel=1e-12)
    assert mem.gradients_bytes == pytest.approx(grads * n, rel=1e-12)
    assert mem.optimizer_bytes == pytest.approx(optim * n, rel=1e-12)


@pytest.mark.parametrize(("schedule", "held"), [("1f1b", 1), ("gpipe", 8)])
def test_last_stage_keeps_the_loss_softmax_of_each_micro_batch_in_flight(
    schedule: str, held: int
) -> None:
    """Megatron's vocab-parallel cross-entropy saves its fp32 softmax (4*s*b*v/t bytes) for the
    backward: 1F1B's last stage runs each micro-batch's backward right after its forward,
    GPipe's holds all m = 32 / (2 * 2) = 8 until the backwards start (it counted one)."""
    inputs = _inputs(8)
    run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2, schedule=schedule)  # type: ignore[arg-type]
    layout = layout_of(inputs, run)
    assert layout.num_micro_batches == 8
    params = stage_params(inputs, layout)
    orders = stage_orders(schedule, 2, 8, 1)
    last = stage_memory(inputs, layout, 1, params[1], in_flight(orders[1]))
    softmax = 4.0 * S * 2 * V / 2
    assert last.other_bytes == pytest.approx(RESERVED_BYTES + held * softmax, rel=1e-12)
    first = stage_memory(inputs, layout, 0, params[0], in_flight(orders[0]))
    assert first.other_bytes == RESERVED_BYTES
    peak = peak_memory(inputs, layout)
    assert peak == max(first, last, key=lambda m: m.total_bytes)
    assert _memory(ScreenCache(inputs, {}), layout, params) == peak  # the screen agrees


@pytest.mark.parametrize("sets", [("training.attention='unfused'",), ("training.dtype='fp32'",)])
def test_context_parallelism_needs_flash_attention(sets: tuple[str, ...]) -> None:
    """Megatron-core runs context parallelism in TransformerEngine's attention only (its own
    ``DotProductAttention`` asserts ``context_parallel_size == 1``; TE's ring runs its flash
    and fused backends, no unfused one): unfused attention at cp > 1 is refused, naming
    ``run.cp``. It was priced, keeping a score matrix of this rank's queries against all keys
    that no run of Megatron holds."""
    inputs = _inputs(2, "model.seq_len=512", *sets)
    assert layout_of(inputs, RunConfig(cp=1, dp=2)).run.cp == 1
    with pytest.raises(ConfigError, match=r"^run\.cp: 2 .*set run\.cp = 1$"):
        layout_of(inputs, RunConfig(cp=2))
