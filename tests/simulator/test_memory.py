"""Memory estimate closed forms."""

from __future__ import annotations

import pytest

from forecast.gpus import load_gpu
from simulator.memory import estimate_memory, layer_activation_bytes
from simulator.models import load_model
from simulator.opgraph import Workload


def test_training_memory_closed_form() -> None:
    model = load_model("tiny-gpt")
    run = Workload(batch=2, seq=64, mode="train")
    mem = estimate_memory(model, run, load_gpu("a100-pcie-80gb"))
    n = model.num_params()
    assert mem.weights_bytes == 4 * n
    assert mem.gradients_bytes == 4 * n
    assert mem.optimizer_bytes == 8 * n  # fp32 Adam: two moments, no master copy
    # Korthikanti eq. 2 in fp32: s*b*h*(34 + 5as/h) * 2 per layer.
    s, b, h, a = 64, 2, 256, 4
    assert layer_activation_bytes(model, run) == pytest.approx(s * b * h * (34 + 5 * a * s / h) * 2)
    assert mem.fits


def test_gpt3_training_does_not_fit_one_gpu() -> None:
    run = Workload(batch=1, seq=2048, mode="train", framework="megatron", dtype="bf16")
    mem = estimate_memory(load_model("gpt3-175b"), run, load_gpu("h100-sxm5-80gb"))
    assert not mem.fits
    assert mem.optimizer_bytes == pytest.approx(12 * load_model("gpt3-175b").num_params())
