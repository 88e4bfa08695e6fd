"""``tilesim serve`` and ``tilesim collective-check`` as a user reads them.

The memory line names every part of its total (the prefill's activations were counted but not
shown, so weights + KV cache fell short of the total by 2.25 GiB for Llama 3 8B at batch 8,
prompt 1024); ``--gen 1`` printed "decode, 0 passes" and a title of "1 tokens"; tp 1 printed
"tensor-parallel communication 0.00 ms"; collective-check printed sizes as "1.049e+06"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulator.serve_plots as serve_plots
from forecast.gpus import load_gpu
from forecast.kernels import ITEMSIZE_BYTES
from simulator.cli import main
from simulator.latency import latency_model_for
from simulator.memory import GIB, RESERVED_BYTES, estimate_memory, layer_activation_bytes
from simulator.models import load_model
from simulator.opgraph import Workload, on_gpu
from simulator.serve import kv_cache_bytes, serve_forecast
from simulator.serve_commands import serve_title
from simulator.serve_request import ServeRequest
from tests.support import drawn
from topologies.measured import Comparison
from topologies.report import check_table, size_text

DERATED = latency_model_for("roofline-derated")
A100 = "a100-sxm4-80gb"
SERVE = ["serve", "--model", "tiny-gpt", "--batch", "8", "--prompt", "64"]
SERVE += ["--latency-model", "roofline-derated"]
OLD_KEYS = {
    "prefill_ms",
    "decode_ms",
    "tpot_ms",
    "first_decode_ms",
    "last_decode_ms",
    "e2e_ms",
    "output_tokens_per_s",
    "by_family_ms",
    "comm_ms",
    "weights_gib",
    "kv_cache_gib",
    "memory_gib",
    "fits",
    "max_batch",
}


def _prefill_activation_bytes(model_id: str, req: ServeRequest) -> float:
    """Closed form of `memory.estimate_memory` at inference: two layers alive, plus the last
    token's logits of each sequence (the prefill under a KV cache runs its head on those)."""
    m, gpu = load_model(model_id), load_gpu(A100)
    run = on_gpu(
        Workload(
            batch=req.batch,
            seq=req.prompt,
            mode="inf",
            framework=req.framework,
            dtype=req.dtype,
            kv_cache=True,
        ),
        gpu,
    )
    logits = req.batch * m.vocab_size * ITEMSIZE_BYTES[req.dtype]
    assert estimate_memory(m, run, gpu).activations_bytes == pytest.approx(
        2 * layer_activation_bytes(m, run) + logits
    )
    return 2 * layer_activation_bytes(m, run) + logits


def test_memory_is_weights_plus_kv_cache_plus_prefill_activations() -> None:
    req = ServeRequest(batch=8, prompt=64, gen=4)
    m, gpu = load_model("tiny-gpt"), load_gpu(A100)
    res = serve_forecast(m, gpu, req, DERATED)
    acts = _prefill_activation_bytes("tiny-gpt", req)
    assert acts > 0
    assert res.activations_gib == pytest.approx(acts / GIB)
    assert res.kv_cache_gib == pytest.approx(kv_cache_bytes(m, req) / GIB)
    assert res.weights_gib == pytest.approx(m.num_params() * 2 / GIB)
    assert res.memory_gib == pytest.approx(res.weights_gib + res.kv_cache_gib + acts / GIB)


def test_fits_counts_the_prefill_activations() -> None:
    """A GPU with room for the weights and the KV cache but not the prefill's activations does
    not fit the request (beside the reserve every estimate keeps free)."""
    req = ServeRequest(batch=8, prompt=64, gen=4)
    m, gpu = load_model("tiny-gpt"), load_gpu(A100)
    acts = _prefill_activation_bytes("tiny-gpt", req)
    without = m.num_params() * 2 + kv_cache_bytes(m, req) + RESERVED_BYTES
    small = gpu.model_copy(update={"hbm_bytes": without + acts / 2})
    res = serve_forecast(m, small, req, DERATED)
    assert not res.fits and res.max_batch < req.batch
    roomy = gpu.model_copy(update={"hbm_bytes": without + acts})
    assert serve_forecast(m, roomy, req, DERATED).fits


def test_json_keeps_every_key_and_adds_the_activations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SERVE, "--gpu", A100, "--gen", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == OLD_KEYS | {"activations_gib", "usable_gib"}
    parts = out["weights_gib"] + out["kv_cache_gib"] + out["activations_gib"]
    assert parts == pytest.approx(out["memory_gib"])


def test_text_names_the_activations_in_the_memory_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SERVE, "--gpu", A100, "--gen", "4"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "memory per GPU" in x)
    assert "weights" in line and "KV cache" in line and "prefill activations" in line


def test_gen_1_prints_no_decode_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SERVE, "--gpu", A100, "--gen", "1"]) == 0
    out = capsys.readouterr().out
    assert "0 passes" not in out and "decode," not in out
    assert "no decode: the one generated token comes from the prefill" in out


def test_gen_2_says_one_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SERVE, "--gpu", A100, "--gen", "2"]) == 0
    out = capsys.readouterr().out
    assert "decode, 1 pass " in out and "1 passes" not in out


def test_tp_1_prints_no_communication_and_tp_4_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SERVE, "--gpu", A100, "--gen", "4"]) == 0
    assert "TP collectives" not in capsys.readouterr().out
    assert main([*SERVE, "--server", "dgx-a100", "--tp", "4", "--gen", "4"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "TP collectives" in x)
    assert float(line.split()[-2]) > 0


@pytest.mark.parametrize(
    ("gen", "tp", "expected"),
    [
        (1, 1, f"tiny-gpt on {A100}, megatron bf16: 64-token prompts, 1 token generated"),
        (5, 4, f"tiny-gpt on 4 x {A100}, megatron bf16: 64-token prompts, 5 tokens generated"),
    ],
)
def test_title_counts_tokens_and_gpus(gen: int, tp: int, expected: str) -> None:
    req = ServeRequest(batch=8, prompt=64, gen=gen, tp=tp)
    assert serve_title("tiny-gpt", A100, req) == f"{expected} (forecast)"


def test_plot_title_at_gen_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kept = drawn(monkeypatch, serve_plots)
    argv = [*SERVE, "--gpu", A100, "--gen", "1", "--plot", str(tmp_path / "s.png")]
    assert main(argv) == 0
    title = kept[0].get_suptitle()
    assert "1 token generated" in title and "1 tokens" not in title and "1 x " not in title


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (100, "100 B"),
        (1023, "1,023 B"),
        (1024, "1 KiB"),
        (2**20, "1 MiB"),
        (33 * 2**20, "33 MiB"),
        (536 * 2**20, "536 MiB"),
        (1.5 * 2**30, "1.5 GiB"),
        (8 * 2**30, "8 GiB"),
        (2**50, "1 PiB"),
        (2048 * 2**50, "2,048 PiB"),
    ],
)
def test_size_text_binary_units(nbytes: float, text: str) -> None:
    assert size_text(nbytes) == text


def test_collective_check_table_prints_human_sizes() -> None:
    rows = [
        Comparison("dgx-a100", 8, 2**20, 36.2e9, 40.4e9, "ring"),
        Comparison("dgx-a100", 8, 8 * 2**30, 231.6e9, 232.3e9, "ring"),
    ]
    lines = check_table(rows).splitlines()
    assert lines[0].split(" | ")[2] == "size"
    assert lines[2].startswith("| dgx-a100 | 8 | 1 MiB | 36.2 | 40.4 |")
    assert lines[3].startswith("| dgx-a100 | 8 | 8 GiB | 231.6 | 232.3 |")
    assert "e+" not in "\n".join(lines)


def test_collective_line_gives_the_size_in_units_and_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", "1e9", "--gpus", "8"]
    assert main([*argv, "--cluster", "dgx-a100"]) == 0
    assert capsys.readouterr().out.startswith("all-reduce 954 MiB (1,000,000,000 B) over 8")


def test_collective_line_prints_small_rates_and_long_times_readably() -> None:
    """A 100-byte all-reduce printed "algbw 0.0 GB/s"; a 1 GB one "3966.2 us"."""
    from topologies import collective_estimate, load_cluster
    from topologies.report import describe

    cluster = load_cluster("dgx-h100", gpus=16)
    small = describe(collective_estimate("all-reduce", 100, tuple(range(8)), cluster))
    assert "0.0 GB/s" not in small and "algbw 0.00" in small
    big = describe(collective_estimate("all-reduce", 1e9, tuple(range(16)), cluster))
    assert " ms," in big and "us," not in big


def test_a_context_too_long_for_one_sequence_is_not_blamed_on_the_weights(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama 3 8B on an 80 GB H100 with a 2^20-token prompt: 15 GiB of weights fit, one
    sequence's KV cache (128 GiB) and prefill activations do not; serve said "the weights alone
    do not fit in GPU memory"."""
    argv = ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--batch", "1"]
    argv += ["--prompt", str(2**20), "--gen", "1", "--latency-model", "roofline-derated"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "weights alone" not in out
    assert "does NOT fit: not even one sequence fits" in out
    assert "GiB the weights leave of 79.00 GiB usable" in out  # 80 GiB less the 1 GiB reserve
    assert main([*argv, "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["max_batch"] == 0 and res["weights_gib"] < res["usable_gib"] == 79.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (7.881e-3, "7.881 ms"),
        (8210.6, "8,211 s"),
        (9.9994e6, "9,999,000 s"),
        (3.271e21, "3.271e+21 s"),
    ],
)
def test_duration_text_never_prints_a_float_tail(seconds: float, text: str) -> None:
    """Whole seconds of 3.271e21 printed "3,271,000,000,000,000,262,144 s"."""
    from forecast.report import duration_text

    assert duration_text(seconds) == text


def test_a_collective_of_hours_reads_in_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--op", "all-reduce", "--bytes", str(2**50), "--gpus", "16"]
    assert main([*argv, "--cluster", "dgx-a100"]) == 1  # a 1 PiB buffer: no GPU holds it
    out = capsys.readouterr().out
    assert ": 8,211 s, algbw" in out  # was "8,210,588.959 ms"
    assert "does NOT fit: its 1 PiB buffer is more than the 80.0 GiB of one a100-sxm4-80gb" in out
    assert main([*argv[:-2], "--bytes", str(2**30), "--gpus", "16", "--cluster", "dgx-a100"]) == 0
