"""Helpers the test modules share: a simulated sweep row, figures kept instead of written, a
catalog file with one value edited, and the one-line refusal every bad input gets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from simulator.models import ModelSpec
from simulator.rows import Row, add_training_cost, blank_row

# a 2-layer GPT-2 small enough to trace on a CPU in a test (examples/gpt2_module.py builds it)
SMALL_GPT2 = ModelSpec(
    id="small-gpt2",
    architecture="gpt2",
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=512,
    num_heads=4,
    vocab_size=1000,
    max_positions=256,
    activation="gelu_new",
)

# the model, cluster and training tables of a 2-layer toy GPT (as tiny-gpt-8gpu) on 8 A100s,
# roofline-priced and fast to sweep; a test adds [study], [sweep] and its options
TOY_GPT_A100 = """[model]
n_layers = 2
hidden_size = 256
n_heads = 8
vocab_size = 1024
seq_len = 128
[cluster]
gpu = "a100-sxm4-80gb"
server = "dgx-a100"
network = "ib-hdr"
num_gpus = 8
[training]
global_batch_size = 16
latency_model = "roofline"
[run]
dp = 0
"""


def simulated_row(option: str, n: int, tps: float, key: str = "x", **fields: Any) -> Row:
    """A simulated, fitting row of option ``option`` on ``n`` GPUs: a 1 s step at ``tps``
    tokens/s of a pure data-parallel layout, overridden by ``fields``; time to train (whole
    steps), cost and energy are filled where ``train_tokens`` (and a price or power) are given."""
    row = blank_row(
        key=f"{option}@{n}/{key}",
        option=option,
        context=f"{option}@{n}",
        num_gpus=n,
        tp=1,
        pp=1,
        dp=n,
        micro_batch_size=1,
        schedule="1f1b",
        virtual_stages=1,
        sequence_parallel=False,
        recompute="none",
        zero_stage=0,
        tier="simulate",
        status="ok",
        iteration_s=1.0,
        tokens_per_s=tps,
        mfu=0.4,
        bubble_fraction=0.0,
        memory_gib_per_gpu=10.0,
    )
    row.update(fields)
    # the step's tokens: tokens/s x step time (a 1 s step: the tokens/s)
    return add_training_cost(row, tokens_per_step=round(row["tokens_per_s"] * row["iteration_s"]))


def drawn(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Figure]:
    """Figures as ``module``'s `save_figure` would write them (laid out), kept instead of
    written."""
    kept: list[Figure] = []

    def keep(fig: Figure, path: Path) -> Path:
        fig.tight_layout()
        fig.canvas.draw()
        kept.append(fig)
        return path

    monkeypatch.setattr(module, "save_figure", keep)
    return kept


def edited(src: Path, key: str, value: str, dest: Path) -> Path:
    """``src`` with the first ``key = ...`` line's value replaced by ``value``."""
    text, n = re.subn(rf"(?m)^{key} = [^#\n]*", f"{key} = {value} ", src.read_text(), count=1)
    assert n == 1, key
    dest.write_text(text)
    return dest


def one_line_refusal(err: str, *needles: str) -> str:
    """The single ``tilesim: ...`` line of ``err`` (no traceback), holding every needle."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilesim: "), err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


def error_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """The one ``tilesim: error: ...`` line a refused command left (`one_line_refusal`)."""
    line = one_line_refusal(capsys.readouterr().err, *needles)
    assert line.startswith("tilesim: error: "), line
    return line


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """Run ``tilesim argv``: exit code 2, nothing on stdout, and `one_line_refusal`."""
    from simulator.cli import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return one_line_refusal(captured.err, *needles)
