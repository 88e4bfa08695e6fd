"""Backward rules against what PyTorch's autograd launches, and the slow memory-bound ops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from forecast.bandwidth import SLOW_MEMORY_OPS
from forecast.kernels import Dtype, OpFamily
from forecast.predict import load_latency_model
from simulator import oprules as r
from simulator.e2e_validate import slow_memory_ops

NEUSIGHT = Path(__file__).resolve().parents[3] / "shared" / "data" / "neusight"

# aten op (as autograd calls it) -> the memory/element-wise op our rules price it as
ATEN_AS = {
    "div.Scalar": "divu",
    "eq.Tensor": "compare",
    "lt.Tensor": "compare",
    "where.self": "where",
    "masked_fill_.Scalar": "masked_fill_full",
}


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func).removeprefix("aten.")
        # a kernel over the tensor: not a view (detach) and not a 0-d constant (scalar_tensor)
        if not name.startswith("detach") and isinstance(out, torch.Tensor) and out.numel() > 1:
            self.ops.append(name)
        return out


def _backward_calls(forward: Any) -> list[str]:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y = forward(x)
    dy = torch.randn_like(y)
    with _Calls() as calls:
        y.backward(dy)
    return calls.ops


def test_max_with_a_constant_backward_is_autograds_five_kernels() -> None:
    """OPT clamps its scores with ``torch.max(scores, tensor(finfo.min))``."""
    const = torch.tensor(torch.finfo(torch.float32).min)
    calls = _backward_calls(lambda x: torch.max(x, const))
    ours = r.maximum("clamp", (48, 8), Dtype.FP32).bw
    assert [ATEN_AS[c] for c in calls] == [k.op for k in ours]


def test_where_with_a_broadcast_mask_backward_is_one_masked_fill() -> None:
    causal = torch.rand(1, 1, 8, 8) > 0.5
    calls = _backward_calls(lambda x: torch.where(causal, x, torch.tensor(-1e4)))
    assert calls == ["where.self"]  # where(mask, dy, 0): the mask is broadcast
    rule = r.memory("mask", "masked_fill", (48, 8), Dtype.FP32, bw_op="masked_fill")
    assert [k.op for k in rule.bw] == ["masked_fill"]


def test_dropout_backward_is_one_slow_memory_kernel() -> None:
    bw = r.dropout("drop", 48, 8, Dtype.FP32).bw
    assert [(k.family, k.op) for k in bw] == [(OpFamily.MEMORY, "dropout_backward")]


def test_slow_memory_ops_are_the_fit_on_the_training_gpus_traces() -> None:
    if not (NEUSIGHT / "labels").is_dir():
        pytest.skip(f"NeuSight labels not present at {NEUSIGHT / 'labels'}")
    memory = load_latency_model("tile-mlp").memory  # type: ignore[attr-defined]
    assert slow_memory_ops(NEUSIGHT, memory) == SLOW_MEMORY_OPS
