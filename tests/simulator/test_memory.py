"""Memory estimate closed forms."""

from __future__ import annotations

import pytest

from forecast.gpus import load_gpu
from simulator.memory import estimate_memory, gemm_weights, layer_activation_bytes
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
    # Korthikanti eq. 2 in fp32: s*b*h*(34 + 5as/h) * 2 per layer, but for its three dropout
    # masks, bool (1 byte) in any dtype: 68 - 2 and 10as/h - as/h
    s, b, h, a = 64, 2, 256, 4
    assert layer_activation_bytes(model, run) == pytest.approx(s * b * h * (66 + 9 * a * s / h))
    assert mem.fits


def test_gpt3_training_does_not_fit_one_gpu() -> None:
    run = Workload(batch=1, seq=2048, mode="train", framework="megatron", dtype="bf16")
    mem = estimate_memory(load_model("gpt3-175b"), run, load_gpu("h100-sxm5-80gb"))
    assert not mem.fits
    assert mem.optimizer_bytes == pytest.approx(12 * load_model("gpt3-175b").num_params())


@pytest.mark.parametrize(
    ("dtype", "grad", "state"), [("bf16", 4, 18), ("fp16", 2, 16), ("fp8", 4, 18)]
)
def test_mixed_precision_state_per_parameter(dtype: str, grad: int, state: int) -> None:
    """2-byte weights, fp32 master copy and two moments (12), and Megatron-LM's main gradients:
    fp32 for bf16 and fp8 (it forces fp32 accumulation; they were counted at 2 bytes while the
    distributed memory counted 4), 16-bit for fp16 (ZeRO's 2 + 2 + 12). fp8 weights stay 16-bit
    (it counted 1 + 1 + 12), beside TE's cached fp8 copies of the GEMM weights
    (`memory.gemm_weights`, 2 bytes an element)."""
    model = load_model("tiny-gpt")
    run = Workload(batch=1, seq=64, mode="train", framework="megatron", dtype=dtype)
    mem = estimate_memory(model, run, load_gpu("h200-sxm-141gb"))
    n = model.num_params()
    cache = 2 * gemm_weights(model, model.num_layers)[0] if dtype == "fp8" else 0.0
    assert mem.weights_bytes - cache == 2 * n and mem.gradients_bytes == grad * n
    assert mem.weights_bytes - cache + mem.gradients_bytes + mem.optimizer_bytes == state * n
    if dtype != "fp8":  # HF eager keeps its gradients in the weights' type
        eager = run.model_copy(update={"framework": "hf-eager"})
        assert estimate_memory(model, eager, load_gpu("h200-sxm-141gb")).gradients_bytes == 2 * n
    inference = estimate_memory(
        model, run.model_copy(update={"mode": "inf"}), load_gpu("h200-sxm-141gb")
    )
    # fp8 inference: 1-byte GEMM weights, bf16 tables, head and norms (it counted 1 byte each)
    gemm = gemm_weights(model, model.num_layers)[0] if dtype == "fp8" else 0.0
    assert inference.weights_bytes == 2 * n - gemm
