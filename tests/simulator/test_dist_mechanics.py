"""Mechanics of a step: attention implementation, async TP overlap, pipeline hops, optimizer
streaming, the ZeRO-3 working set, and how the published runs' stated settings are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forecast.kernels import Dtype, OpFamily
from simulator.comm import collective_s, layer_comm
from simulator.dist_memory import layer_activation_bytes, stage_memory
from simulator.dist_validate import published_scenario
from simulator.dp_comm import DEEPSPEED_2021_ZERO3_EFFICIENCY, dp_grad_s, dp_param_gather_s
from simulator.memory import parallel_units
from simulator.models import load_model
from simulator.optimizer_step import ADAM_REF, OPTIMIZER_BYTES_PER_PARAM
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, layout_of, peak_memory, simulate
from simulator.stagecost import block_times, shard_kernels
from simulator.stepcosts import stage_params, step_costs, tp_bw_exposed_s
from topologies import collective_time_s
from topologies.algorithms import Op

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"
GPT3 = ROOT / "scenarios" / "gpt3_175b_a100.toml"


def _tiny(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=sets))


def _softmax_dims(inputs: SimInputs, run: RunConfig) -> list[tuple[int, ...]]:
    sk = shard_kernels(inputs, run)
    return [k.dims for k, _ in sk.layer_fw if k.family is OpFamily.SOFTMAX]


def test_attention_auto_is_flash_in_16_bit_and_unfused_in_fp32() -> None:
    assert _tiny().attention == "flash"
    assert _tiny("training.dtype='fp32'").attention == "unfused"
    assert _tiny("training.attention='unfused'").attention == "unfused"
    assert _tiny("training.framework='hf-eager'").attention == "unfused"


def test_unfused_attention_materialises_the_scores() -> None:
    run = RunConfig(tp=2, micro_batch_size=2)
    flash, unfused = _tiny(), _tiny("training.attention='unfused'")
    assert _softmax_dims(flash, run) == []
    # b * a/t * s rows of s scores: 2 * 8/2 * 128 rows, 128 columns
    assert _softmax_dims(unfused, run) == [(2 * 4 * 128, 128)]
    ops = {k.op for k, _ in shard_kernels(unfused, run).attention_fw}
    assert {"bmm", "softmax", "dropout"} <= ops  # what selective recompute re-runs
    # the score term of the activation memory appears without flash attention
    lay = layout_of(flash, RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2))
    assert layer_activation_bytes(unfused, lay) > layer_activation_bytes(flash, lay)


def test_optimizer_streams_the_stated_bytes_per_parameter() -> None:
    run = RunConfig(tp=2, micro_batch_size=2)
    per_byte = {}
    for dtype in ("fp16", "bf16", "fp32"):
        inputs = _tiny(f"training.dtype='{dtype}'")
        table = latency_table(inputs, [run])
        bt = block_times(shard_kernels(inputs, run), table, run)
        per_byte[dtype] = bt.adam_s_per_param / OPTIMIZER_BYTES_PER_PARAM[Dtype(dtype)]
        assert per_byte[dtype] == pytest.approx(table[ADAM_REF] / ADAM_REF.bytes())
    assert OPTIMIZER_BYTES_PER_PARAM[Dtype.FP16] == 54  # fp16: + grad cast, unscale/inf check
    assert OPTIMIZER_BYTES_PER_PARAM[Dtype.BF16] == 42


@pytest.mark.parametrize("sp", [False, True])
def test_async_tp_overlap_hides_only_what_the_gemms_cover(sp: bool) -> None:
    inputs = _tiny()
    base = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2, sequence_parallel=sp)
    lay = layout_of(inputs, base)
    table = latency_table(inputs, [base])
    bt = block_times(shard_kernels(inputs, base), table, base)
    lc = layer_comm(inputs, lay)
    blocking = tp_bw_exposed_s(bt, lc, base.model_copy(update={"tp_comm_overlap": False}))
    assert blocking == pytest.approx(lc.tp_bw_s)
    assert len(bt.col_wgrad_s) == 2  # attention (qkv) and MLP (fc1)
    if sp:
        hidden = sum(
            max(0.0, lc.tp_ag_s - d) + max(0.0, lc.tp_rs_s - w)
            for d, w in zip(bt.col_dgrad_s, bt.col_wgrad_s, strict=True)
        )
        want = 2 * lc.tp_ag_s + hidden
    else:
        want = sum(max(0.0, lc.tp_ar_s - w) for w in bt.col_wgrad_s)
    assert tp_bw_exposed_s(bt, lc, base) == pytest.approx(want)
    assert tp_bw_exposed_s(bt, lc, base) <= blocking + 1e-15


def test_pipeline_hop_gathers_the_activation_over_tp() -> None:
    inputs = _tiny()
    for sp in (False, True):
        run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2, sequence_parallel=sp)
        lay = layout_of(inputs, run)
        lc = layer_comm(inputs, lay)
        a = 2 * 128 * 256 * 2  # micro-batch * seq * hidden * bf16
        send = collective_s("send-recv", a / 2, lay.pp_hops[0], inputs.cluster)
        assert lc.pp_hop_s == pytest.approx(send + (0.0 if sp else lc.tp_ag_s))


def test_moe_activations_grow_with_experts_per_token() -> None:
    """Top-k routing keeps k copies of each token's MLP activations (Korthikanti's 16 of the 24
    tensor-parallel units, here ffn = 4h); it was the same memory for every k. The experts'
    input, k copies of each token gathered whole on every TP rank, adds 2k units not divided
    by t (`memory.saved_bytes`); sequence parallelism (Megatron-LM's MoE with TP) divides
    the 10 replicated units by t too."""
    run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2, sequence_parallel=True)

    def acts(k: int) -> float:
        inputs = _tiny("model.num_experts=4", f"model.experts_per_token={k}")
        return layer_activation_bytes(inputs, layout_of(inputs, run))

    s, b, h, t = 128, 2, 256, 2
    assert acts(1) == pytest.approx(
        s * b * h * ((10 + 24) / t + 2), rel=1e-12
    )  # bf16: 2-byte units
    assert acts(2) - acts(1) == pytest.approx(s * b * h * (16 / t + 2), rel=1e-12)
    assert acts(4) - acts(1) == pytest.approx(3 * s * b * h * (16 / t + 2), rel=1e-12)


def test_swiglu_mlp_activations_count_gate_up_and_fc2_input() -> None:
    """Of Korthikanti's 24 tensor-parallel units only the MLP's 16 scale with ffn/4h (attention
    keeps its 8), and SwiGLU saves three ffn-wide tensors (gate, up, fc2's input: 6 ffn/h), not
    two; a top-2 MoE keeps that MLP part twice. Llama-like ffn = 3.5h: 8 + 21 = 29 units, top-2
    50 (it was 24 x 0.875 = 21 and 21 + 14 = 35: the SwiGLU Mixtral and Llama scenarios
    under-counted their activations), plus the experts' input, 2k = 4 units whole on every TP
    rank (`memory.saved_bytes`)."""
    run = RunConfig(tp=2, pp=2, dp=2, micro_batch_size=2)
    s, b, h, t = 128, 2, 256, 2
    swiglu = ("model.activation='swiglu'", "model.ffn_hidden_size=896")

    def acts(*sets: str, sp: bool = False) -> float:
        inputs = _tiny(*swiglu, *sets)
        lay = layout_of(inputs, run.model_copy(update={"sequence_parallel": sp}))
        return layer_activation_bytes(inputs, lay) / (s * b * h)

    assert acts() == pytest.approx(10 + 29 / t, rel=1e-12)
    moe = ("model.num_experts=4", "model.experts_per_token=2")
    assert acts(*moe, sp=True) == pytest.approx((10 + 50) / t + 4, rel=1e-12)  # MoE: SP
    half = _tiny(*swiglu, *moe).model.model_copy(update={"moe_every": 2})
    assert parallel_units(half) == pytest.approx(39.5, rel=1e-12)  # 1 of 2 layers is MoE


def test_zero3_holds_two_gathered_layers_not_the_whole_model() -> None:
    sets = ("cluster.num_gpus=384", "run.tp=1", "run.pp=1", "run.dp=384", "run.zero_stage=3")
    sets += ("run.schedule='1f1b'", "run.virtual_stages=1", "training.global_batch_size=384")
    inputs = resolve(load_scenario(GPT3, overrides=sets))
    s = load_scenario(GPT3, overrides=sets)
    mem = peak_memory(inputs, layout_of(inputs, s.run))
    m = load_model("gpt3-175b")
    params = m.num_params()
    unit = max(m.layer_params(moe=False), m.vocab_size * m.hidden_size)
    assert mem.weights_bytes == pytest.approx(2 * params / 384 + 2 * 2 * unit, rel=2e-3)
    assert mem.fits


def _zero_stage_weights(zero: int, *sets: str) -> list[float]:
    """Weight bytes (ZeRO-3: shards plus the gathered modules) on one GPU of each stage."""
    inputs = _tiny(*sets, f"run.zero_stage={zero}")
    lay = layout_of(inputs, load_scenario(TINY, overrides=(*sets, f"run.zero_stage={zero}")).run)
    return [
        stage_memory(inputs, lay, s, p, in_flight=1).weights_bytes
        for s, p in enumerate(stage_params(inputs, lay))
    ]


def test_zero3_gathers_only_modules_the_stage_holds() -> None:
    """A table wider than a layer (vocabulary 65,536 x 256) lives on the first and last stages
    only: a middle stage of one layer gathers that layer, not two tables; the end stages gather
    their layer and their table. One DP rank shards nothing, so ZeRO-3 adds nothing there."""
    sets = ("model.n_layers=4", "model.vocab_size=65536", "run.tp=1", "run.pp=4", "run.dp=2")
    m = _tiny(*sets).model
    layer, table = m.layer_params(moe=False), 65536 * 256
    positions = m.max_positions * 256
    final_norm = 2 * 256  # held by the last stage
    params = [layer + table + positions, layer, layer, layer + table + final_norm]
    gathered = [layer + table, layer, layer, layer + table]
    expect = [2 * (p / 2 + g) for p, g in zip(params, gathered, strict=True)]
    assert _zero_stage_weights(3, *sets) == pytest.approx(expect, rel=1e-6)
    one_rank = (*sets[:-1], "run.dp=1", "cluster.num_gpus=4")
    assert _zero_stage_weights(3, *one_rank) == _zero_stage_weights(0, *one_rank)


def _row(rid: str, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": rid,
        "group": "B_narayanan2021_megatron_ptdp_a100",
        "n_layers": 24,
        "hidden_size": 2304,
        "n_heads": 24,
        "n_kv_heads": 24,
        "ffn_hidden_size": 9216,
        "vocab_size": 51200,
        "seq_len": 2048,
        "global_batch_size": 512,
        "micro_batch_size": None,
        "num_gpus": 32,
        "gpus_per_node": 8,
        "tp": 1,
        "pp": 1,
        "dp": 32,
        "cp": 1,
        "sequence_parallel": False,
        "virtual_pipeline_stages": None,
        "recompute": "full (activation recomputation)",
        "optimizer_sharding": "none",
    }
    return row | over


def test_published_rows_take_the_authors_stated_settings() -> None:
    # Table 1, 1.7B: micro-batch 16 and PyTorch DDP (buckets overlap the backward pass)
    run = published_scenario(_row("narayanan21_t1_1.7B_32gpu")).run
    assert run.micro_batch_size == 16 and run.overlap_grad_reduce and run.buckets > 100
    assert not run.tp_comm_overlap and run.virtual_stages == 1
    # Table 2, 530B PTD-P: no script, so Megatron's defaults: plain 1F1B, local DDP
    big = _row(
        "narayanan21_t2_ptdp_529.6B_560gpu",
        n_layers=105,
        hidden_size=20480,
        n_heads=128,
        n_kv_heads=128,
        ffn_hidden_size=81920,
        global_batch_size=2240,
        micro_batch_size=1,
        num_gpus=560,
        tp=8,
        pp=35,
        dp=2,
    )
    run = published_scenario(big).run
    assert run.virtual_stages == 1 and run.schedule == "1f1b"
    assert not run.overlap_grad_reduce and run.micro_batch_size == 1
    # Table 1, 530B: the script's one layer per virtual stage
    t1_row = {"id": "narayanan21_t1_529.6B_2520gpu", "dp": 9, "num_gpus": 2520}
    t1 = published_scenario(big | t1_row | {"global_batch_size": 2520}).run
    assert t1.virtual_stages == 3 and t1.schedule == "1f1b-interleaved"
    # Korthikanti (2022 code): v from the row, async TP overlap, unfused attention
    k = _row("korthikanti22_x", group="C_korthikanti2022_selective_recompute_a100")
    s = published_scenario(k | {"virtual_pipeline_stages": 1, "micro_batch_size": 4})
    assert s.run.tp_comm_overlap and s.run.micro_batch_size == 4
    assert s.training.attention == "unfused"


@pytest.mark.parametrize("model_id", ["gpt3-175b", "llama3-70b", "mixtral-8x7b"])
def test_per_tensor_parameters_sum_to_the_layer(model_id: str) -> None:
    m = load_model(model_id)
    for moe in (False, True) if m.num_experts > 1 else (False,):
        assert sum(m.layer_param_tensors(moe=moe)) == m.layer_params(moe=moe)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_deepspeed_2021_zero3_blocks_compute_on_every_tensor_collective(recompute: str) -> None:
    """One stage: every gather and reduce-scatter sits on the compute stream's path, so the step's
    exposed DP time is the closed form: m x (gathers x (1 or 2 with full recompute) + gathers
    + reduce-scatters), per parameter tensor, at the stated efficiency."""
    sets = ("run.tp=1", "run.pp=1", "run.dp=8", "run.zero_stage=3", f"run.recompute='{recompute}'")
    s = load_scenario(TINY, overrides=(*sets, "run.zero3_impl='deepspeed-2021'"))
    inputs = resolve(s)
    lay = layout_of(inputs, s.run)
    res = simulate(inputs, s.run, latency_table(inputs, [s.run]))
    m, group, cl = inputs.model, lay.dp_group, inputs.cluster
    tensors = m.layer_param_tensors(moe=False)
    table = m.vocab_size * m.hidden_size
    # tied head: no second table; the final layer norm's weight and bias
    ends = [table, m.max_positions * m.hidden_size, m.hidden_size, m.hidden_size]

    def total(op: Op, itemsize: int) -> float:
        per_layer = sum(
            collective_time_s(op, t * itemsize, group, cl, algorithm="ring") for t in tensors
        )
        rest = sum(collective_time_s(op, t * itemsize, group, cl, algorithm="ring") for t in ends)
        return m.num_layers * per_layer + rest

    gather, scatter = total("all-gather", 2), total("reduce-scatter", 4)
    per_mb = (
        (3 if recompute == "full" else 2) * gather + scatter
    ) / DEEPSPEED_2021_ZERO3_EFFICIENCY
    assert res.exposed_comm_s["dp"] == pytest.approx(lay.num_micro_batches * per_mb, rel=1e-9)
    fsdp = simulate(
        inputs, s.run.model_copy(update={"zero3_impl": "fsdp"}), latency_table(inputs, [s.run])
    )
    assert fsdp.iteration_s < res.iteration_s


def test_each_gradient_bucket_is_its_own_collective() -> None:
    """Overlapped DP reduction runs ``buckets`` collectives of 1/buckets of the gradients, each
    with its own launch and latency (it was the whole reduction's time / buckets, so more
    buckets always looked faster). Tiny's 0.8M-parameter gradients are latency-bound: 64
    buckets cost far more than one, and the step is slower for them."""
    sets = ("run.tp=1", "run.pp=1", "run.dp=8", "run.zero_stage=1")
    steps = {}
    for n in (1, 64):
        s = load_scenario(TINY, overrides=(*sets, f"run.buckets={n}"))
        inputs = resolve(s)
        lay = layout_of(inputs, s.run)
        table = latency_table(inputs, [s.run])
        params = stage_params(inputs, lay)[0]
        sync = step_costs(inputs, lay, table).chunks[0][0].grad_sync_s
        assert sync == pytest.approx(n * dp_grad_s(params / n, inputs, lay), rel=1e-12)
        steps[n] = simulate(inputs, s.run, table).iteration_s
        no_overlap = s.run.model_copy(update={"overlap_grad_reduce": False})
        after = step_costs(inputs, layout_of(inputs, no_overlap), table).chunks[0][0]
        assert after.grad_sync_s == pytest.approx(dp_grad_s(params, inputs, lay), rel=1e-12)
    assert steps[64] > steps[1]


def test_overlapped_param_gather_exposes_its_first_bucket_only() -> None:
    sets = ("run.tp=1", "run.pp=1", "run.dp=8", "run.zero_stage=1", "run.buckets=4")
    s = load_scenario(TINY, overrides=sets)
    inputs = resolve(s)
    table = latency_table(inputs, [s.run])
    plain = simulate(inputs, s.run, table)
    over = simulate(inputs, s.run.model_copy(update={"overlap_param_gather": True}), table)
    lay = layout_of(inputs, s.run)
    params = sum(stage_params(inputs, lay))
    whole = dp_param_gather_s(params, inputs, lay)
    first = dp_param_gather_s(params / 4, inputs, lay)  # one bucket: its own launch and latency
    assert whole > first > whole / 4
    assert plain.iteration_s - over.iteration_s == pytest.approx(whole - first, rel=1e-9)


def _param_gather_runs(*sets: str) -> tuple[SimInputs, RunConfig, RunConfig]:
    """Inputs and a ZeRO-1 run without and with ``overlap_param_gather``."""
    s = load_scenario(TINY, overrides=("run.tp=1", "run.zero_stage=1", *sets))
    over = s.run.model_copy(update={"overlap_param_gather": True})
    return resolve(s), s.run, over


def test_param_gather_overlap_needs_gradient_buckets() -> None:
    """Without ``overlap_grad_reduce`` Megatron-LM keeps one bucket (bucket_size None; it also
    refuses --overlap-param-gather then), so nothing of the all-gather hides: the step is that
    of no overlap at any ``buckets``. It was 198.3 us without overlap, 159.6 us at 16 buckets
    (the screen likewise)."""
    steps = []
    for n in (1, 16):
        inputs, plain, over = _param_gather_runs(
            "run.pp=1", "run.dp=8", f"run.buckets={n}", "run.overlap_grad_reduce=false"
        )
        table = latency_table(inputs, [plain])
        cache = ScreenCache(inputs, table)
        for run in (plain, over):
            steps += [simulate(inputs, run, table).iteration_s, screen(cache, run).iteration_s]
    assert steps == pytest.approx([steps[0]] * 8, rel=1e-12)


def test_overlapped_param_gather_waits_for_one_bucket_of_one_chunk() -> None:
    """``buckets`` counts per model chunk: with two chunks per stage (interleaved) the first
    bucket holds 1/(2 x 4) of the stage's weights, not 1/4; full simulation and screen alike."""
    sets = ("model.n_layers=8", "run.pp=2", "run.dp=4", "run.buckets=4")
    sets += ("run.schedule='1f1b-interleaved'", "run.virtual_stages=2")
    inputs, plain, over = _param_gather_runs(*sets)
    table = latency_table(inputs, [plain])
    lay = layout_of(inputs, over)
    params = stage_params(inputs, lay)
    first = [dp_param_gather_s(p / 8, inputs, lay) for p in params]
    assert step_costs(inputs, lay, table).param_gather_s == pytest.approx(first, rel=1e-12)
    cache = ScreenCache(inputs, table)
    top = max(params)
    hidden = dp_param_gather_s(top, inputs, lay) - dp_param_gather_s(top / 8, inputs, lay)
    gain = screen(cache, plain).iteration_s - screen(cache, over).iteration_s
    assert gain == pytest.approx(hidden, rel=1e-9)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_expert_state_shards_over_the_ranks_that_hold_the_expert(zero: int) -> None:
    """ZeRO shards an expert's state over dp x cp / ep ranks (the ones holding that expert),
    not over all dp x cp: with 4 experts on dp 4, ep 2 halves each GPU's experts and also
    halves the ranks sharing each one, so the expert share of sharded state stays as at ep 1
    (it was halved: the optimizer state of MoE layouts under-counted by ep)."""
    inputs = _tiny("model.num_experts=4", "cluster.num_gpus=16")

    def memory(ep: int) -> Any:
        run = RunConfig(
            tp=2, pp=2, dp=4, ep=ep, micro_batch_size=1, zero_stage=zero, sequence_parallel=True
        )
        layout = layout_of(inputs, run)
        return stage_memory(inputs, layout, 0, stage_params(inputs, layout)[0], 1)

    one, two = memory(1), memory(2)
    assert two.optimizer_bytes == pytest.approx(one.optimizer_bytes, rel=1e-12)
    if zero >= 2:
        assert two.gradients_bytes == pytest.approx(one.gradients_bytes, rel=1e-12)
    else:  # unsharded gradients: each GPU holds half the experts
        assert two.gradients_bytes < one.gradients_bytes


def test_grouped_query_attention_keeps_narrower_k_and_v() -> None:
    """Attention's 8 units are Q, K, V and the projection's input at 2 each; with a quarter of
    the heads as key/value heads K and V keep a quarter: 4 + 1 = 5 (it stayed 8)."""
    dense = _tiny().model
    gqa = dense.model_copy(update={"num_kv_heads": dense.num_heads // 4})
    assert parallel_units(dense) == pytest.approx(8 + 16, rel=1e-12)
    assert parallel_units(gqa) == pytest.approx(5 + 16, rel=1e-12)
