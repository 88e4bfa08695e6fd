"""``tilesim serve`` and ``tilesim predict`` at the edges of what they model (audit s14).

A sequence longer than `models.MAX_SEQ` tokens is refused in one line (it ran out of memory:
the causal attention's per-row-block list, or the per-pass array of a huge ``--gen``); the
decode sum over every pass is the closed form of the interpolated one; a rate under 0.01
tokens/s prints its digits, not "0.00"; a dtype the GPU lacks, or a model that cannot
generate, names the flag the user set.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import simulator.serve as serve
import simulator.serve_request as serve_request
from forecast.gpus import load_gpu
from simulator.cli import main
from simulator.models import MAX_SEQ, load_model
from simulator.serve import serve_forecast
from simulator.serve_commands import serve_text, serve_title
from simulator.serve_request import ServeRequest

H100 = "h100-sxm5-80gb"
SERVE = ["serve", "--model", "tiny-gpt", "--gpu", H100, "--latency-model", "roofline-derated"]
PREDICT = ["predict", "--model", "llama3-8b", "--gpu", H100, "--batch", "1", "--mode", "inf"]


def _one_line(capsys: pytest.CaptureFixture[str], *named: str) -> None:
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert "Traceback" not in cap.err
    for word in named:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "prompt, gen, named",
    [
        (99_999_999_999, 2, "--prompt"),  # was a MemoryError (or the OOM killer) after 30 s
        (5, 10_000_000_000, "--gen"),  # was numpy's _ArrayMemoryError for 74.5 GiB
        (MAX_SEQ, 2, "--prompt"),
    ],
)
def test_a_sequence_past_the_modelled_length_is_one_line(
    prompt: int, gen: int, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*SERVE, "--batch", "1", "--prompt", str(prompt), "--gen", str(gen)]
    assert main(args) == 2
    _one_line(capsys, named, "2^27")


@pytest.mark.parametrize("framework", ["megatron", "hf-eager"])
def test_predict_seq_past_the_modelled_length_is_one_line(
    framework: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It ran the causal attention's list of 7.8e8 row blocks out of memory (megatron)."""
    args = [*PREDICT, "--seq", str(MAX_SEQ + 1), "--dtype", "bf16", "--framework", framework]
    assert main(args) == 2
    _one_line(capsys, "--seq", "2^27")


def test_predict_runs_line_past_the_modelled_length_is_its_error(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    runs = Path(str(tmp_path)) / "runs.jsonl"
    run = {"model": "tiny-gpt", "gpu": H100, "batch": 1, "mode": "inf", "framework": "megatron"}
    lines = [{**run, "seq": 99_999_999_999, "dtype": "bf16"}, {**run, "seq": 8, "dtype": "bf16"}]
    runs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["predict", "--runs", str(runs), "--latency-model", "roofline"]) == 1
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert out[0]["line"] == 1 and "field 'seq'" in out[0]["error"] and "2^27" in out[0]["error"]
    assert "e2e_ms" in out[1]


def test_decode_sum_is_the_interpolated_sum_in_closed_form() -> None:
    """`PassTimes.all_decode` summed ``np.interp`` over an array of every decode pass; the
    closed form (each segment's trapezoid over its whole-number passes) agrees with it."""
    req = ServeRequest(batch=1, prompt=8, gen=1000)
    passes = serve_request.decode_samples(req.gen)
    rng = np.random.default_rng(0)
    values = list(rng.uniform(1.0, 2.0, len(passes)))
    p = serve.PassTimes(req, load_model("tiny-gpt"), passes, [0.0, *values], [], [])
    every = np.arange(1, req.gen, dtype=np.float64)
    expected = float(np.interp(every, np.array(passes, np.float64), values).sum())
    assert p.all_decode(values) == pytest.approx(expected, rel=1e-12)
    one = serve.PassTimes(req.model_copy(update={"gen": 2}), p.local, [1], [0.0, 3.0], [], [])
    assert one.all_decode([3.0]) == 3.0


def test_a_huge_gen_is_summed_without_an_array_per_pass() -> None:
    """gen 2^27: the decode time is the mean pass x (gen - 1), not an array of 134M passes."""
    m, gpu = load_model("llama3-8b"), load_gpu(H100)  # rotary: no learned position table
    from simulator.latency import latency_model_for

    req = ServeRequest(batch=1, prompt=1, gen=MAX_SEQ)
    res = serve_forecast(m, gpu, req, latency_model_for("roofline-derated"))
    assert res.first_decode_ms <= res.tpot_ms <= res.last_decode_ms
    assert res.decode_ms == pytest.approx(res.tpot_ms * (req.gen - 1))


def test_a_rate_under_one_hundredth_prints_its_digits() -> None:
    """1e6-token prompts on Llama 3 8B: 2 tokens in 603 s printed "0.00 output tokens/s"."""
    res = serve.ServeResult(
        prefill_ms=603_320.0,
        decode_ms=64.0,
        tpot_ms=64.0,
        first_decode_ms=64.0,
        last_decode_ms=64.0,
        e2e_ms=603_384.0,
        output_tokens_per_s=2 / 603.384,
        by_family_ms={},
        comm_ms=0.0,
        weights_gib=15.0,
        kv_cache_gib=122.0,
        memory_gib=411.7,
        fits=False,
        max_batch=0,
        activations_gib=274.7,
        usable_gib=79.0,
    )
    text = serve_text(res, ServeRequest(batch=1, prompt=1_000_000, gen=2))
    assert "0.0033 output tokens/s" in text
    fast = res.model_copy(update={"output_tokens_per_s": 34.9})
    assert "34.90 output tokens/s" in serve_text(fast, ServeRequest(batch=1, prompt=8, gen=2))
    assert serve_title("m", "g", ServeRequest(batch=1, prompt=8, gen=1)).endswith("(forecast)")


@pytest.mark.parametrize(
    "gpu, dtype, model, named",
    [
        ("a100-sxm4-80gb", "fp8", "tiny-gpt", "--dtype fp8: a100-sxm4-80gb"),
        ("p4", "bf16", "tiny-gpt", "--dtype bf16: p4"),
        # megatron's fp8 attention runs in bf16: it said "--dtype bf16: v100-sxm2-32gb ..."
        ("v100-sxm2-32gb", "fp8", "tiny-gpt", "--dtype fp8: v100-sxm2-32gb"),
        (H100, "bf16", "switch-base-4", "--model: switch-base-4"),
    ],
)
def test_serve_errors_name_the_flag(
    gpu: str, dtype: str, model: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed ``dtype fp8: ...`` and ``model: switch-base-4 ...``: no flag of serve's."""
    args = ["serve", "--model", model, "--gpu", gpu, "--batch", "1", "--prompt", "8"]
    args += ["--gen", "2", "--dtype", dtype, "--latency-model", "roofline-derated"]
    assert main(args) == 2
    _one_line(capsys, named)


def test_predict_names_the_dtype_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """``--dtype fp8 --framework megatron`` on a T4 said ``--dtype bf16: t4 has no bf16 peak``."""
    args = ["predict", "--model", "tiny-gpt", "--gpu", "t4", "--batch", "1", "--seq", "8"]
    args += ["--mode", "train", "--dtype", "fp8", "--framework", "megatron"]
    assert main(args) == 2
    _one_line(capsys, "--dtype fp8: t4 has no fp8 peak")


def test_predict_names_batch_and_seq_past_the_modelled_tokens(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said ``batch x (past + seq) = 1e+13 tokens per pass``: past is no flag of predict's."""
    from pathlib import Path

    args = [*PREDICT[:5], "--batch", "100000000", "--seq", "100000", "--mode", "inf"]
    assert main(args) == 2
    _one_line(capsys, "--batch 100000000 x --seq 100000", "2^40", "smaller --batch")
    runs = Path(str(tmp_path)) / "runs.jsonl"
    run = {"model": "tiny-gpt", "gpu": H100, "batch": 10**8, "seq": 10**5, "mode": "inf"}
    runs.write_text(json.dumps(run) + "\n")
    assert main(["predict", "--runs", str(runs)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert "'batch' 100000000 x 'seq' 100000" in out["error"] and "past" not in out["error"]
