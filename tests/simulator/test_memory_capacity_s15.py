"""GPU memory as a program sees it: NVIDIA's HBM "80 GB" are 80 GiB (an A100 80GB shows as
81920 MiB), and every estimate keeps `RESERVED_BYTES` free for the CUDA context and library
workspaces, as a distributed stage's memory counts it. Read as 1e9 bytes, an 80 GB GPU held
74.5 GiB, and layouts that fit were refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from forecast.gpus import load_gpu
from simulator.cli import main
from simulator.memory import RESERVED_BYTES, estimate_memory, usable_bytes
from simulator.models import load_model
from simulator.opgraph import Workload

GIB = 2**30


def test_hbm_capacities_are_binary_and_gddr_decimal() -> None:
    assert load_gpu("a100-sxm4-80gb").hbm_bytes == 80 * GIB
    assert load_gpu("a100-pcie-40gb").hbm_bytes == 40 * GIB
    assert load_gpu("h200-sxm-141gb").hbm_bytes == 141 * GIB
    assert load_gpu("l4").hbm_bytes == 24e9  # GDDR6: 23034 MiB = 24.15e9 bytes with ECC on
    assert usable_bytes(load_gpu("a100-sxm4-80gb")) == 79 * GIB


def test_a_single_gpu_estimate_fits_only_with_the_reserve_free() -> None:
    model, run = load_model("llama3-8b"), Workload(batch=1, seq=2048, mode="train")
    gpu = load_gpu("a100-sxm4-80gb")
    total = estimate_memory(model, run, gpu).total_bytes
    edge = gpu.model_copy(update={"hbm_bytes": total + RESERVED_BYTES})
    assert estimate_memory(model, run, edge).fits
    short = gpu.model_copy(update={"hbm_bytes": total + RESERVED_BYTES / 2})
    assert not estimate_memory(model, run, short).fits


def _simulate(capsys: pytest.CaptureFixture[str], *sets: str) -> dict[str, Any]:
    argv = ["simulate", "tiny-gpt-8gpu", "--json"]
    code = main([*argv, *(a for s in sets for a in ("--set", s))])
    return {"code": code, **json.loads(capsys.readouterr().out)}


def test_a_scenario_can_keep_more_free_for_fragmentation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`training.memory_reserved_gib` replaces the 1 GiB reserve in every stage's memory: the
    bytes move one for one, and a layout that fits with 1 GiB does not with a margin that
    leaves it no room."""
    base = _simulate(capsys)
    more = _simulate(capsys, "training.memory_reserved_gib=3.5")
    assert more["memory_gib_per_gpu"] - base["memory_gib_per_gpu"] == pytest.approx(2.5)
    assert base["fits"] and more["fits"]
    full = _simulate(capsys, "training.memory_reserved_gib=80")  # all of an A100 80GB
    assert not full["fits"] and full["code"] == 1
