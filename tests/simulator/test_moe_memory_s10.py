"""Activation memory and router weights of a mixture-of-experts layer, Mixtral 8x7B (h = 4096,
ffn = 14336 per expert, 32 heads, 8 KV heads of 128, k = 2 of E = 8 experts, 32 layers), derived
from Megatron-core's MoELayer with the all-to-all token dispatcher
(megatron/core/transformer/moe/{moe_layer,router,token_dispatcher,experts,moe_utils}.py).

Per token of one layer, in 2-byte units of ``h`` (bytes = s*b*h*units in bf16), on one GPU of
tp = t (expert TP = t, as Megatron-core's default):

* attention and norms as a dense layer (Korthikanti et al. 2022, eq. 2): the 10 (norm inputs,
  QKV input, dropout masks, the MLP's input, which the router's gating linear saves) and
  attention's 2 (2 q + 2 kv) = 2 (2 + 0.5) = 5 with GQA (K and V 8 * 128 / 4096 = 1/4 wide);
* the experts: each token goes to k = 2 experts; the dispatcher all-to-alls the routed tokens
  over EP and then all-gathers them over TP (``gather_from_sequence_parallel_region``), so
  every TP rank runs all ``k * s * b`` routed rows of its TP group (whatever ep: balanced
  routing brings ``k * s * b / t`` rows to each EP rank from the ep ranks, times t), whole in
  h: fc1 saves that input, 2k = 4 units, not divided by t; SwiGLU's input (2 ffn / t wide)
  and fc2's input (ffn / t) are k * 6 ffn / (h t) = 42 / t;
* the router's logits and probabilities (E = 8 and k = 2 values a token) are 1/500 of h: left
  out.

So with sequence parallelism (which Megatron-core requires for MoE with tp > 1 in training):
(10 + 5 + 42) / t + 4; without it (every TP rank holds all tokens): 10 + 47 / t + 4.
Selective recompute re-runs the attention core only (flash attention: nothing to drop).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.dist_memory import layer_activation_bytes as dist_layer_bytes
from simulator.memory import layer_activation_bytes
from simulator.models import load_model
from simulator.opgraph import Workload
from simulator.parallel import RunConfig
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.shard_params import expert_params, moe_layer_params
from simulator.simulate import layout_of

SEQ, H, FFN, V, LAYERS, K, E = 4096, 4096, 14336, 32000, 32, 2, 8
ATTENTION = 2 * (2 * 1 + 2 * 8 * 128 / H)  # Q and the projection's input, K and V at 1/4
EXPERTS = K * 6 * FFN / H  # SwiGLU's input (2 ffn) and fc2's input (ffn), k of them
ROUTED = 2 * K  # the experts' input: k copies of each token, whole on every TP rank

SCENARIO = f"""
[study]
name = "mixtral-moe-memory"
[model]
id = "mixtral-8x7b"
seq_len = {SEQ}
[cluster]
gpu = "a100-sxm4-80gb"
server = "dgx-a100"
network = "ib-hdr"
num_gpus = 64
[training]
global_batch_size = 64
dtype = "bf16"
framework = "megatron"
latency_model = "roofline"
[run]
pp = 2
distributed_optimizer = true
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "mixtral.toml"
    path.write_text(SCENARIO)
    return path


def _inputs(path: Path, *sets: str) -> SimInputs:
    return resolve(load_scenario(path, overrides=sets))


def _units(tp: int, sp: bool) -> float:
    if sp:
        return (10 + ATTENTION + EXPERTS) / tp + ROUTED
    return 10 + (ATTENTION + EXPERTS) / tp + ROUTED


# Megatron-LM runs MoE with tensor parallelism only under sequence parallelism
VALID_TP_SP = [(1, False), (2, True), (4, True)]


@pytest.mark.parametrize(("tp", "sp"), VALID_TP_SP)
@pytest.mark.parametrize("ep", [1, 2, 8])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_moe_layer_keeps_the_experts_routed_input_whole_on_every_tp_rank(
    scenario: Path, tp: int, ep: int, sp: bool, recompute: str
) -> None:
    """It kept 4 units (64 MiB a layer at b = 1) fewer at every layout: the experts' gathered
    input (k copies of each token, h wide) was not counted; at tp 4 with SP 228 -> 292 MiB."""
    inputs = _inputs(scenario)
    run = RunConfig(pp=2, tp=tp, ep=ep, sequence_parallel=sp, recompute=recompute)  # type: ignore[arg-type]
    want = SEQ * 1 * H * _units(tp, sp)  # bf16: a 2-byte unit of s*b*h is s*b*h bytes
    got = dist_layer_bytes(inputs, layout_of(inputs, run))
    assert got == pytest.approx(want, rel=1e-12)


def test_full_recompute_keeps_the_layer_input_and_one_whole_layer(scenario: Path) -> None:
    """Full recompute stores the layer input (2/t with SP); the layer being recomputed holds its
    full set, the experts' routed input included."""
    inputs = _inputs(scenario)
    run = RunConfig(pp=2, tp=4, ep=8, sequence_parallel=True, recompute="full")
    layout = layout_of(inputs, run)
    assert dist_layer_bytes(inputs, layout) == pytest.approx(SEQ * H * 2 / 4, rel=1e-12)
    working = dist_layer_bytes(inputs, layout, working=True)
    assert working == pytest.approx(SEQ * H * _units(4, True), rel=1e-12)


def _simulate_gib(path: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> float:
    args = ["simulate", str(path), "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return float(json.loads(capsys.readouterr().out)["memory_gib_per_gpu"])


def test_simulate_reports_the_moe_activations_per_gpu(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tilesim simulate``'s memory per GPU grows, from micro-batch 1 to 2, by one sequence's
    activations of all 32 layers (pp 1, 1F1B: one micro-batch in flight) plus the loss's fp32
    softmax of its tokens (4 * s * V / t bytes): tp 4 with SP, ep 8."""
    sets = ("run.pp=1", "run.tp=4", "run.ep=8", "run.sequence_parallel=true")
    one = _simulate_gib(scenario, capsys, *sets, "run.micro_batch_size=1")
    two = _simulate_gib(scenario, capsys, *sets, "run.micro_batch_size=2")
    want = LAYERS * SEQ * H * _units(4, True) + 4 * SEQ * V / 4
    assert (two - one) * 2**30 == pytest.approx(want, rel=1e-9)


def test_single_gpu_moe_layer_counts_the_routed_copies() -> None:
    """One GPU (`memory.layer_activation_bytes`): Megatron keeps the experts' input (2k); HF
    eager (MixtralSparseMoeBlock) also multiplies each expert's output by its routing weight and
    saves that output for the weight's gradient (another 2k), and its attention is unfused
    (5as/h); its eager experts (MixtralBlockSparseTop2MLP: w2(act_fn(w1(x)) * w3(x))) keep
    one more ffn-wide tensor than Megatron's fused SwiGLU: SiLU's output, saved by the multiply
    (8 ffn/h per expert, not 6). They were 57 and 57 + 5as/h units."""
    model = load_model("mixtral-8x7b")
    s, b = 1024, 2
    megatron = Workload(batch=b, seq=s, framework="megatron", dtype="bf16")
    hf = Workload(batch=b, seq=s, framework="hf-eager", dtype="bf16")
    dense = 10 + ATTENTION + EXPERTS
    assert layer_activation_bytes(model, megatron) == pytest.approx(s * b * H * (dense + 2 * K))
    scores = 5 * 32 * s / H
    eager = dense + K * 2 * FFN / H  # SiLU(gate), k experts a token
    assert layer_activation_bytes(model, hf) == pytest.approx(s * b * H * (eager + 4 * K + scores))


def test_single_gpu_dense_layer_is_unchanged() -> None:
    """Dense models keep eq. 2 (34 units at ffn = 4h; Llama's SwiGLU 8 + 6 ffn/h)."""
    model = load_model("llama3-8b")
    s, b = 1024, 1
    run = Workload(batch=b, seq=s, framework="megatron", dtype="bf16")
    units = 10 + 2 * (2 + 2 * 8 / 32) + 6 * 14336 / 4096
    assert layer_activation_bytes(model, run) == pytest.approx(s * b * 4096 * units)


@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 2), (4, 8)])
def test_router_weight_is_whole_on_every_tp_rank(tp: int, ep: int) -> None:
    """Megatron-core's TopKRouter holds its (E, h) weight unsplit on every TP rank (its gradient
    is all-reduced over TP like the norms'); the expert shards are 1 / (tp ep) of the experts.
    It was divided by tp: 24,576 parameters short per layer on one GPU of tp 4."""
    model = load_model("mixtral-8x7b")
    attention = H * (H + 2 * 1024) + H * H  # QKV (GQA: K, V 1024 wide) and the projection
    norms = 2 * H  # two RMSNorms, whole on every TP rank (Megatron replicates them)
    expert = 3 * H * FFN  # gate, up, down
    assert expert_params(model) == expert
    want = attention / tp + norms + H * E + E * expert / (tp * ep)
    run = RunConfig(tp=tp, ep=ep)
    assert moe_layer_params(model, run) == pytest.approx(want, rel=1e-15)
