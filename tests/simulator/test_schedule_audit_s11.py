"""Pipeline schedules, ZeRO-3, recompute FLOPs and the closed-form screen against their closed
forms (session 11's schedule audit). Stage costs are uniform where a closed form needs it."""

from __future__ import annotations

import itertools

import pytest

from simulator.execgraph import build_exec_graph
from simulator.models import load_model
from simulator.pipeline_forms import pipeline_hops
from simulator.results import forward_flops_per_token
from simulator.scenario import load_scenario, resolve
from simulator.scheduler import schedule
from simulator.schedules import SCHEDULES, in_flight
from simulator.screen import screen
from simulator.screen_cache import ScreenCache
from simulator.simulate import latency_table, simulate, simulate_timeline
from simulator.space import find_scenario
from simulator.task_costs import ChunkCost, StepCosts

TINY = find_scenario("tiny-gpt-8gpu")


def _costs(
    pp: int, m: int, v: int, name: str, *, hop: float = 0.0, chunk: ChunkCost | None = None
) -> StepCosts:
    """Every chunk alike (default: forward 1/v, backward 2/v), free optimizer."""
    c = chunk or ChunkCost(fw_compute_s=1.0 / v, bw_compute_s=2.0 / v)
    return StepCosts(
        chunks=tuple(tuple(c for _ in range(v)) for _ in range(pp)),
        num_micro_batches=m,
        schedule=name,
        pp_hop_s=hop,
        optimizer_s=(0.0,) * pp,
        param_gather_s=(0.0,) * pp,
        overlap_grad_reduce=False,
    )


# --- 1, 2: schedules -------------------------------------------------------------------------


@pytest.mark.parametrize(("pp", "v"), [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_interleaved_warm_up_and_stage_0_activations_are_megatrons(pp: int, v: int) -> None:
    """Megatron-core's interleaved schedule runs ``(p - r - 1) * 2 + (v - 1) * p`` warm-up
    forwards on rank ``r`` and then holds one more: stage 0 keeps ``2(p-1) + (v-1)p + 1``
    chunks of ``L/(pv)`` layers, i.e. ``L (1 + (p-1)/(pv))`` layers of activations
    (Korthikanti et al. 2022, section 4.2.3), against 1F1B's ``L``."""
    m = 4 * pp
    for r, order in enumerate(SCHEDULES["1f1b-interleaved"](pp, m, v)):
        warm = next(i for i, slot in enumerate(order) if slot.phase == "B") - 1
        assert warm == min((pp - r - 1) * 2 + (v - 1) * pp, m * v)
    stage0 = in_flight(SCHEDULES["1f1b-interleaved"](pp, m, v)[0])
    assert stage0 == 2 * (pp - 1) + (v - 1) * pp + 1
    assert stage0 / (pp * v) == pytest.approx(1 + (pp - 1) / (pp * v))
    assert in_flight(SCHEDULES["1f1b"](pp, m, 1)[0]) == pp
    assert in_flight(SCHEDULES["gpipe"](pp, m, 1)[0]) == m


def test_gpipe_with_unequal_stages_is_two_flow_shops() -> None:
    """GPipe runs every forward, then every backward: each phase is a flow shop of ``m``
    equal jobs, whose span is the sum of the stages' times plus ``m - 1`` of the slowest's,
    plus a send per boundary. Stage 0 slow forward, stage 1 slow backward: the step is
    ``sum F + sum B + (m-1)(max F + max B) + 2(p-1)h``, longer than ``(m+p-1) max(F+B)``."""
    m, hop = 6, 0.1
    chunks = ((ChunkCost(3.0, 1.0),), (ChunkCost(1.0, 3.0),))
    costs = StepCosts(
        chunks=chunks,
        num_micro_batches=m,
        schedule="gpipe",
        pp_hop_s=hop,
        optimizer_s=(0.0, 0.0),
        param_gather_s=(0.0, 0.0),
        overlap_grad_reduce=False,
    )
    want = (3 + 1) + (1 + 3) + (m - 1) * (3 + 3) + 2 * hop
    assert schedule(build_exec_graph(costs)).makespan_s == pytest.approx(want, rel=1e-12)
    assert want > (m + 1) * 4.0 + 2 * hop


def _sends_on_path(pp: int, m: int, v: int, name: str, hop: float) -> float:
    span = schedule(build_exec_graph(_costs(pp, m, v, name, hop=hop))).makespan_s
    return (span - 3.0 * (m + (pp - 1) / v)) / hop


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_sends_on_the_critical_path_have_closed_forms(pp: int) -> None:
    """Equal stages, sends shorter than a chunk's forward. GPipe and interleaved 1F1B pay the
    fill and the drain, ``2(pv - 1)`` sends (interleaving's extra warm-up hides the steady
    state's); 1F1B's steady state waits on the round trip through all ``p`` stages, ``2(p-1)``
    sends per ``p`` micro-batches: ``2((p-1)m/p + p - 2)`` where ``p`` divides ``m``. The
    screen used ``2(pv - 1) + (m - 1)`` for both 1F1B schedules (interleaved, p 4, v 2,
    m 16: 29 against 14; 1F1B, p 8, m 32: 45 against 68)."""
    hop = 1e-3
    for m in (pp, 2 * pp, 4 * pp):
        assert _sends_on_path(pp, m, 1, "gpipe", hop) == pytest.approx(2 * (pp - 1))
        ofob = 2 * ((pp - 1) * m / pp + pp - 2)
        assert _sends_on_path(pp, m, 1, "1f1b", hop) == pytest.approx(ofob)
        for v in (2, 3):
            got = _sends_on_path(pp, m, v, "1f1b-interleaved", hop)
            assert got == pytest.approx(2 * (pp * v - 1))
            assert 2 * pipeline_hops("1f1b-interleaved", pp, m, v) == pytest.approx(got)
        assert 2 * pipeline_hops("1f1b", pp, m, 1) == pytest.approx(ofob)
        assert 2 * pipeline_hops("gpipe", pp, m, 1) == 2 * (pp - 1)


def test_1f1b_sends_below_pp_micro_batches() -> None:
    """Fewer micro-batches than stages: ``2(p - 1 + max(0, m - 2))`` sends."""
    for pp, m in itertools.product((3, 4, 8), range(1, 9)):
        if m < pp:
            got = _sends_on_path(pp, m, 1, "1f1b", 1e-3)
            assert got == pytest.approx(2 * (pp - 1 + max(0, m - 2)))
            assert 2 * pipeline_hops("1f1b", pp, m, 1) == pytest.approx(got)


# --- 3: ZeRO-3 ---------------------------------------------------------------------------------


def test_zero3_gathers_and_scatters_share_the_links() -> None:
    """ZeRO-3 gathers the chunk's weights before its forward and its backward and
    reduce-scatters its gradients after the backward, per micro-batch: 1.5x an all-reduce's
    bytes each micro-batch. With free compute the step is their sum ``m (2g + r)``; the
    gathers ran on a stream of their own, each collective at the links' full speed, so the
    step was ``max(2 m g, m r)`` plus an end (4 micro-batches, g 1, r 2: 9 s, not 16 s)."""
    m, g, r = 4, 1.0, 2.0
    free = ChunkCost(0.0, 0.0, zero3_gather_s=g, zero3_scatter_s=r)
    assert schedule(build_exec_graph(_costs(1, m, 1, "1f1b", chunk=free))).makespan_s == (
        pytest.approx(m * (2 * g + r), rel=1e-12)
    )
    # compute-bound: everything but the first gather and the last scatter hides
    busy = ChunkCost(1.0, 2.0, zero3_gather_s=0.1, zero3_scatter_s=0.1)
    for name, pp in (("1f1b", 1), ("gpipe", 1), ("1f1b", 2)):
        t = schedule(build_exec_graph(_costs(pp, m, 1, name, chunk=busy)))
        assert t.makespan_s == pytest.approx(0.1 + 3.0 * (m + pp - 1) + 0.1, rel=1e-12)


def test_a_comm_bound_zero3_step_carries_every_gather_and_scatter() -> None:
    """The tiny model at dp 8, 16 micro-batches: each GPU's links carry ``m (2g + r)``."""
    sets = ("run.tp=1", "run.pp=1", "run.dp=8", "run.zero_stage=3", "run.micro_batch_size=1")
    scenario = load_scenario(TINY, overrides=(*sets, "training.global_batch_size=128"))
    inputs = resolve(scenario)
    res, t = simulate_timeline(inputs, scenario.run, latency_table(inputs, [scenario.run]))
    (chunk,) = t.step.costs.chunks[0]
    m = res.num_micro_batches
    assert m == 16
    wire = m * (2 * chunk.zero3_gather_s + chunk.zero3_scatter_s)
    compute = m * (sum(chunk.parts("F")) + sum(chunk.parts("B")))
    assert wire > compute  # the links set the pace
    assert res.iteration_s >= wire
    assert res.iteration_s <= wire + compute + res.optimizer_s


# --- 4: recompute and MFU ----------------------------------------------------------------------


def test_selective_recompute_adds_korthikantis_share_of_a_forward() -> None:
    """Korthikanti et al. 2022 (section 5): selective recompute re-runs the attention core,
    ``4 s h`` of a layer's ``24 h^2 + 4 s h`` forward FLOPs per token, 2.7% for GPT-3 175B
    (h 12288, s 2048) and 1.6% for MT-NLG 530B (h 20480)."""
    for h, share in ((12288, 0.027), (20480, 0.016)):
        assert 4 * 2048 * h / (24 * h * h + 4 * 2048 * h) == pytest.approx(share, abs=5e-4)
    w, a, _ = forward_flops_per_token(load_model("gpt3-175b"), 2048)
    assert a / (w + a) == pytest.approx(0.027, abs=5e-4)


def test_mfu_counts_model_flops_and_hfu_the_recomputed_forward() -> None:
    """MFU is ``3 (w + a + head)`` FLOPs per token whatever the recompute (Narayanan et al.
    2021, eq. 3 without its 4th pass); HFU adds ``a`` (selective) or ``w + a`` (full)."""
    out = {}
    for rc in ("none", "selective", "full"):
        scenario = load_scenario(TINY, overrides=(f"run.recompute='{rc}'",))
        inputs = resolve(scenario)
        out[rc] = simulate(inputs, scenario.run, latency_table(inputs, [scenario.run]))
    w, a, head = forward_flops_per_token(inputs.model, inputs.seq_len)
    tokens = inputs.global_batch_size * inputs.seq_len
    peak = inputs.gpu.peak_for(inputs.dtype) * inputs.num_gpus
    for rc, extra in (("none", 0.0), ("selective", a), ("full", w + a)):
        res = out[rc]
        assert res.mfu * peak * res.iteration_s == pytest.approx(3 * (w + a + head) * tokens)
        assert res.hfu * peak * res.iteration_s == pytest.approx(
            (3 * (w + a + head) + extra) * tokens
        )


# --- 5: the screen against the simulation ------------------------------------------------------


def _screen_over_sim(*sets: str) -> float:
    scenario = load_scenario(TINY, overrides=sets)
    inputs = resolve(scenario)
    table = latency_table(inputs, [scenario.run])
    return (
        screen(ScreenCache(inputs, table), scenario.run).iteration_s
        / simulate(inputs, scenario.run, table).iteration_s
    )


@pytest.mark.parametrize("mbs", [1, 2])
def test_screen_prices_gpipe_as_the_simulation_does(mbs: int) -> None:
    """The tiny model on tp 4 x pp 2, GPipe: the embedding makes stage 0's forward the slow
    one and the head stage 1's backward; the screen's ``(m + p - 1) max(F + B)`` read
    0.864x (mbs 1) and 0.887x the simulated step."""
    sets = ("run.tp=4", "run.pp=2", "run.dp=1", "run.schedule='gpipe'", "run.zero_stage=0")
    ratio = _screen_over_sim(*sets, f"run.micro_batch_size={mbs}")
    assert ratio == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("pp", [1, 2])
def test_screen_prices_zero3_like_the_simulation(pp: int) -> None:
    """ZeRO-3 (fsdp): the screen charged every gather and scatter on top of the compute
    (1.6x the simulated step at pp 2; 2.4x for GPT-3 175B on 1,024 A100s); its stream hides
    under compute but for its ends, or sets the pace when busier."""
    sets = ("run.tp=1", f"run.pp={pp}", "run.dp=0", "run.zero_stage=3")
    assert _screen_over_sim(*sets) == pytest.approx(1.0, abs=0.1)
