"""Review of session 10's commits: what one change broke in another's area, and help text
that no longer said what the code does. Catalog files only (no ../shared data)."""

from __future__ import annotations

import pytest

from forecast.gpus import load_gpu
from forecast.kernels import ITEMSIZE_BYTES, Dtype
from simulator.cli import build_parser
from simulator.memory import parallel_units, usable_bytes
from simulator.models import load_model
from simulator.opgraph import has_flash_attention
from simulator.serve import max_batch
from simulator.serve_request import ServeRequest


def _per_sequence_bytes(prompt: int, *, scores: bool) -> tuple[float, float]:
    """(weights, bytes per sequence) of Llama 3 8B served in fp16, one token generated, from
    first principles: the KV cache ``2 x layers x kv_heads x head_dim x (prompt + gen)``
    elements; the prefill's activations, two layers alive in inference (`memory` docstring),
    each ``s*h*(10 + parallel units + 5as/h)`` 2-byte units (Korthikanti et al. 2022, eq. 2;
    the ``5as/h`` scores exist only where attention is unfused); the head's logits of the last
    token, ``vocab`` wide."""
    m = load_model("llama3-8b")
    item = ITEMSIZE_BYTES[Dtype.FP16]
    s, h, a = prompt, m.hidden_size, m.num_heads
    units = 10.0 + parallel_units(m) + (5.0 * a * s / h if scores else 0.0)
    acts = 2.0 * s * h * units * item / 2.0 + m.vocab_size * item
    kv = 2.0 * m.total_layers * m.kv_heads * m.dhead * (prompt + 1) * item
    return float(m.num_params() * item), acts + kv


def test_serve_memory_counts_the_unfused_scores_where_the_gpu_has_no_flash_attention() -> None:
    """A V100 has no FlashAttention-2 kernels: Megatron runs its unfused CoreAttention there
    (`opgraph.on_gpu`), which ``serve`` already priced, and which writes the ``b*a*s*s`` scores
    to memory. ``serve``'s memory (and so the largest batch that fits) took the flash profile's
    activations instead, without the scores (`predict` applies `on_gpu` first): at 2,048
    tokens the largest batch read 18 where 7 fit."""
    gpu = load_gpu("v100-sxm2-32gb")
    assert not has_flash_attention(gpu)
    req = ServeRequest(batch=1, prompt=2048, gen=1, dtype=Dtype.FP16)
    weights, per_seq = _per_sequence_bytes(2048, scores=True)
    want = int((usable_bytes(gpu) - weights) // per_seq)
    assert want == 7  # (32 GiB - 1 GiB reserved - 14.96 GiB of weights) / 2.06 GiB a sequence
    assert max_batch(load_model("llama3-8b"), gpu, req) == want


def test_serve_memory_on_a_flash_attention_gpu_has_no_scores() -> None:
    """Where FlashAttention-2 runs (A100) the scores never reach memory: unchanged."""
    gpu = load_gpu("a100-sxm4-80gb")
    req = ServeRequest(batch=1, prompt=2048, gen=1, dtype=Dtype.FP16)
    weights, per_seq = _per_sequence_bytes(2048, scores=False)
    assert max_batch(load_model("llama3-8b"), gpu, req) == int(
        (usable_bytes(gpu) - weights) // per_seq
    )


def _option_help(command: str, flag: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command" or a.choices)
    sweep = sub.choices[command]  # type: ignore[index]
    action = next(a for a in sweep._actions if flag in a.option_strings)
    return " ".join(str(action.help).split())


@pytest.mark.parametrize("flag", ["--candidates"])
def test_sweep_help_says_cost_ranking_simulates_the_cheapest(flag: str) -> None:
    """Since ``--rank cost`` simulates the layouts the screen rates cheapest
    (`sweep_eval.select_candidates`), ``--candidates`` are not always the fastest: its help
    said "layouts the screen rates fastest" only."""
    assert "cheapest" in _option_help("sweep", flag)
