"""`RunConfig.grad_accumulation_fusion`: Megatron-LM's weight-gradient GEMMs accumulate into
the fp32 main gradients, so no element-wise add per weight and micro-batch remains; the biases'
and norms' adds stay, and the default (off) keeps every add."""

from __future__ import annotations

from pathlib import Path

from forecast.kernels import OpFamily
from simulator.parallel import RunConfig
from simulator.scenario import load_scenario, resolve
from simulator.simulate import latency_table, simulate
from simulator.stagecost import shard_kernels

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny_gpt_8gpu.toml"
H = 256  # the tiny scenario's hidden size (ffn 4h)


def _adds(run: RunConfig) -> list[tuple[int, ...]]:
    inputs = resolve(load_scenario(TINY))
    layer = shard_kernels(inputs, run).layer_bw
    return sorted(k.dims for k, _ in layer if k.family is OpFamily.ELEMENTWISE and k.op == "add")


def test_fused_weight_gradients_drop_the_weights_adds_only() -> None:
    run = RunConfig(tp=2, pp=1, dp=0, micro_batch_size=1)
    plain, fused = _adds(run), _adds(run.model_copy(update={"grad_accumulation_fusion": True}))
    weights = sorted([(H, 3 * H // 2), (H // 2, H), (H, 2 * H), (2 * H, H)])  # qkv proj fc1 fc2
    assert sorted(d for d in plain if d[0] > 1) == weights
    assert [d for d in fused if d[0] > 1] == []
    assert sorted(d for d in plain if d[0] == 1) == sorted(fused)  # biases and norms kept


def test_fusion_makes_a_step_faster_and_off_is_the_default() -> None:
    inputs = resolve(load_scenario(TINY))
    run = load_scenario(TINY).run
    assert run.grad_accumulation_fusion is False
    fused = run.model_copy(update={"grad_accumulation_fusion": True})
    table = latency_table(inputs, [run, fused])
    assert simulate(inputs, fused, table).iteration_s < simulate(inputs, run, table).iteration_s


def test_one_screen_cache_tells_fused_from_unfused() -> None:
    """`ScreenCache` memoises block times per shard shape: a run with the adds fused, screened
    after one without on the same cache, gets its own (faster) blocks, as a fresh cache gives."""
    from simulator.screen import screen
    from simulator.screen_cache import ScreenCache

    inputs = resolve(load_scenario(TINY))
    run = load_scenario(TINY).run
    fused = run.model_copy(update={"grad_accumulation_fusion": True})
    table = latency_table(inputs, [run, fused])
    shared = ScreenCache(inputs, table)
    plain_s = screen(shared, run).iteration_s
    fused_s = screen(shared, fused).iteration_s
    assert fused_s == screen(ScreenCache(inputs, table), fused).iteration_s
    assert fused_s < plain_s
