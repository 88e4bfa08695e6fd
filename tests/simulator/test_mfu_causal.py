"""The causal MFU beside Narayanan's: closed forms, the kernels it counts, rows and the report.

``mfu`` counts attention's scores and values over the whole ``S x S`` matrix (Narayanan et al.
2021, eq. 3); ``mfu_causal`` over the ``S (S + 1) / 2`` (query, key) pairs a causal decoder
attends, and equals ``mfu`` for a model that attends both ways (BERT).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from forecast.kernels import OpFamily
from simulator.cli import main
from simulator.parallel import RunConfig
from simulator.report import markdown_report, procurement_table, top_table
from simulator.results import (
    OVER_100_REASON,
    StepResult,
    causal_attention_flops,
    forward_flops_per_token,
)
from simulator.rows import COLUMNS, LATER_COLUMNS
from simulator.saved_rows import load_rows
from simulator.scenario import SimInputs, load_scenario, resolve
from simulator.simulate import latency_table, simulate
from simulator.stagecost import Counted, shard_kernels

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny_gpt_8gpu.toml"


def _tiny(*sets: str) -> SimInputs:
    return resolve(load_scenario(TINY, overrides=sets))


def _step(inputs: SimInputs) -> StepResult:
    run = load_scenario(TINY).run
    return simulate(inputs, run, latency_table(inputs, [run]))


def test_causal_attention_counts_s_plus_one_over_two_s_of_the_matrix() -> None:
    """Per sequence ``S (S + 1) / 2`` pairs of ``4 h_attention`` FLOPs a layer, against eq. 3's
    ``S`` pairs a token: the ratio is ``(S + 1) / (2 S)``, about a half, for GQA as for MHA
    (the scores are per query head)."""
    for sets in ((), ("model.n_kv_heads=2",)):
        m = _tiny(*sets).model
        for s in (1, 128, 100_000):
            _, a, _ = forward_flops_per_token(m, s)
            assert causal_attention_flops(m, s) == a * s * (s + 1) / (2 * s)
            assert causal_attention_flops(m, s) == m.num_layers * 4 * 256 * s * (s + 1) // 2


def test_mfu_causal_replaces_the_attention_term_with_its_causal_pairs() -> None:
    """``mfu_causal x peak x step = 3 (w + head) tokens + 3 B x causal attention``; ``mfu`` and
    ``hfu`` keep eq. 3's whole matrix."""
    inputs = _tiny()
    res = _step(inputs)
    m, s, b = inputs.model, inputs.seq_len, inputs.global_batch_size
    w, a, head = forward_flops_per_token(m, s)
    work = res.iteration_s * inputs.num_gpus * inputs.gpu.peak_for(inputs.dtype)
    causal = 3 * ((w + head) * b * s + b * causal_attention_flops(m, s))
    assert res.mfu_causal * work == pytest.approx(causal, rel=1e-12)
    assert res.mfu * work == pytest.approx(3 * (w + a + head) * b * s, rel=1e-12)
    assert res.mfu_causal < res.mfu


def test_long_sequence_mfu_passes_90_percent_and_the_causal_one_is_about_half() -> None:
    """tiny-gpt at 100,000 tokens, where attention is 98% of eq. 3's FLOPs: MFU 95.8% (over
    90%, as the README says), the causal figure below 100% and within 2 points of half of it."""
    res = _step(_tiny("model.seq_len=100000"))
    assert res.mfu > 0.9
    assert res.mfu_causal < 1.0
    assert res.mfu_causal / res.mfu == pytest.approx(0.5, abs=0.02)


def test_a_bidirectional_model_has_mfu_causal_equal_to_mfu() -> None:
    """BERT's encoder attends both ways: no pair is masked, the two figures are one, exactly."""
    inputs = _tiny()
    bert = dataclasses.replace(
        inputs, model=inputs.model.model_copy(update={"architecture": "bert"})
    )
    res = _step(bert)
    assert not bert.model.causal and inputs.model.causal
    assert res.mfu_causal == res.mfu


def _attention_flops(kernels: Counted) -> float:
    return sum(k.flops() * n for k, n in kernels if k.family is OpFamily.ATTENTION)


@pytest.mark.parametrize("comm_type", ["p2p", "all_gather", "a2a"])
def test_the_kernels_simulated_run_the_pairs_mfu_causal_counts(comm_type: str) -> None:
    """Summed over the ``tp x cp`` ranks, one layer's forward attention kernels of a micro-batch
    run exactly the causal pairs `causal_attention_flops` counts a layer, under every context
    parallel schedule: the p2p ring (step 0 and ``cp - 1`` half steps, the two alternatives of a
    step alike), all_gather (one alternative per rank) and a2a (every rank alike)."""
    inputs = _tiny("model.seq_len=4096")
    m, tp, cp, mbs = inputs.model, 2, 2, 2
    run = RunConfig(tp=tp, cp=cp, cp_comm_type=comm_type, micro_batch_size=mbs)  # type: ignore[arg-type]
    sk = shard_kernels(inputs, run)
    if comm_type == "p2p":
        steps = {_attention_flops(r) for r in sk.ring_fw}
        assert len(steps) == 1
        per_rank = [_attention_flops(sk.attention_fw) + (cp - 1) * steps.pop()] * cp
    elif comm_type == "all_gather":
        per_rank = [_attention_flops(r) for r in sk.core_fw]
    else:
        per_rank = [_attention_flops(sk.core_fw[0])] * cp
    assert len(per_rank) == cp
    layer = causal_attention_flops(m, inputs.seq_len) / m.num_layers
    assert tp * sum(per_rank) == mbs * layer


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-GPU sweep of the tiny scenario (serial)."""
    out = tmp_path_factory.mktemp("mfu") / "sweep"
    sweep = ["sweep", str(TINY), "--serial", "--no-progress", "--out", str(out)]
    assert main([*sweep, "--set", "sweep.world_size=[4]"]) == 0
    return out


def test_simulate_prints_mfu_causal_beside_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --json`` has the field, and its text prints it beside MFU."""
    assert main(["simulate", str(TINY), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert 0 < row["mfu_causal"] < row["mfu"]
    assert main(["simulate", str(TINY)]) == 0
    text = capsys.readouterr().out
    assert f"MFU {row['mfu']:.1%}, causal MFU {row['mfu_causal']:.1%}" in text


def test_a_sweeps_rows_and_report_carry_mfu_causal(swept: Path) -> None:
    """rows.jsonl and rows.csv have the column; the report prints it beside MFU and says what
    it is."""
    assert "mfu_causal" in COLUMNS
    rows = load_rows(swept)
    sim = [r for r in rows if r["tier"] == "simulate" and r["status"] == "ok"]
    assert sim and all(0 < r["mfu_causal"] < r["mfu"] for r in sim)
    parquet, csv = swept / "rows.parquet", swept / "rows.csv"  # csv without pyarrow
    frame = pd.read_parquet(parquet) if parquet.is_file() else pd.read_csv(csv)
    assert "mfu_causal" in frame.columns
    report = (swept / "report.md").read_text()
    assert "| MFU | causal MFU |" in report and "* `causal MFU`:" in report
    assert f"| {sim[0]['mfu']:.1%} | {sim[0]['mfu_causal']:.1%} |" in report


def test_rows_an_older_tilesim_wrote_still_plot_and_report(
    swept: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rows.jsonl written before ``mfu_causal`` existed loads (the column null), `tilesim
    plot` draws it, and the report's tables print ``-`` for the column."""
    old = [{k: v for k, v in r.items() if k not in LATER_COLUMNS} for r in load_rows(swept)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    loaded = load_rows(tmp_path)
    assert all(r["mfu_causal"] is None for r in loaded)
    best = top_table(loaded).splitlines()[2]
    assert "% | - |" in best
    assert "% | - |" in procurement_table(loaded).splitlines()[2]
    assert "causal MFU" in markdown_report(loaded, title="t", pruned=())
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "scaling.png").is_file()


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_hfu_causal_adds_the_recomputed_forward_over_the_causal_pairs(recompute: str) -> None:
    """``hfu_causal x peak x step`` is the causal model FLOPs plus the recomputed forward with
    its attention over the causal pairs: nothing (none), that attention (selective), the layer
    weights and that attention (full). Without recomputation it equals ``mfu_causal``."""
    inputs = _tiny()
    run = load_scenario(TINY).run.model_copy(update={"recompute": recompute})
    res = simulate(inputs, run, latency_table(inputs, [run]))
    m, s, b = inputs.model, inputs.seq_len, inputs.global_batch_size
    w, a, _ = forward_flops_per_token(m, s)
    work = res.iteration_s * inputs.num_gpus * inputs.gpu.peak_for(inputs.dtype)
    attention = b * causal_attention_flops(m, s)
    extra = {"none": 0.0, "selective": attention, "full": w * b * s + attention}[recompute]
    assert res.hfu_causal * work == pytest.approx(res.mfu_causal * work + extra, rel=1e-12)
    extra_matrix = {"none": 0.0, "selective": a, "full": w + a}[recompute] * b * s
    assert res.hfu * work == pytest.approx(res.mfu * work + extra_matrix, rel=1e-12)
    if recompute == "none":
        assert res.hfu_causal == res.mfu_causal and res.hfu == res.mfu
    else:
        assert res.mfu_causal < res.hfu_causal < res.hfu


def test_a_bidirectional_model_has_hfu_causal_equal_to_hfu() -> None:
    """BERT under full recomputation: every pair is attended, so the two hardware figures are
    one, exactly."""
    inputs = _tiny()
    bert = dataclasses.replace(
        inputs, model=inputs.model.model_copy(update={"architecture": "bert"})
    )
    run = load_scenario(TINY).run.model_copy(update={"recompute": "full"})
    res = simulate(bert, run, latency_table(bert, [run]))
    assert res.hfu_causal == res.hfu > res.mfu


def test_simulate_prints_hfu_and_causal_hfu(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate`` prints both hardware figures beside the model ones, as --json has them."""
    assert main(["simulate", str(TINY), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(TINY)]) == 0
    text = capsys.readouterr().out
    assert f"HFU {row['hfu']:.1%}, causal HFU {row['hfu_causal']:.1%}" in text
    assert "hfu_causal" in COLUMNS and "hfu_causal" in LATER_COLUMNS


def test_simulate_explains_a_figure_over_100_percent(capsys: pytest.CaptureFixture[str]) -> None:
    """At 131,072 tokens the roofline-timed tiny GPT read "HFU 130.5%" with no word on why."""
    argv = ["simulate", str(TINY), "--set", "model.seq_len=131072"]
    assert main([*argv, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["hfu"] > 1.0 > row["hfu_causal"]
    assert main(argv) == 0
    words = " ".join(capsys.readouterr().out.split())  # the note wraps at 90 columns
    assert f"(over 100%: MFU, HFU and hardware TFLOP/s: {OVER_100_REASON})" in words
    assert "they count every (query, key) pair" in words
    assert main(["simulate", str(TINY)]) == 0
    assert "over 100%" not in capsys.readouterr().out


def test_the_sweep_table_explains_an_mfu_over_100_percent(swept: Path) -> None:
    """The terminal printed "MFU 163.7%" at 131,072 tokens with no word on why."""
    from simulator.report import mfu_over_100_note

    rows = load_rows(swept)
    assert mfu_over_100_note(rows) == ""  # every MFU of the tiny sweep is under 100%
    over = [{**r, "mfu": 1.637} if r.get("mfu") is not None else r for r in rows]
    assert mfu_over_100_note(over) == f"MFU over 100%: {OVER_100_REASON}"
    assert "they count every (query, key) pair" in OVER_100_REASON
