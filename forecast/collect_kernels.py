"""The kernels the collector times: one zero-argument callable per (op, dtype, shape).

``gemm`` and ``bmm`` run ``torch.bmm`` (fp8 gemm: ``torch._scaled_mm`` with tensor-wise
scales), ``attention`` ``scaled_dot_product_attention`` over ``BH`` heads, the row ops a
``B x H`` tensor, and ``adam`` steps one parameter of ``B x H`` elements. ``allow_tf32`` is on
for ``tf32`` rows only (`matmul_mode`). Imported by `forecast.profile` only, which the CLI
imports lazily; imports on a CPU-only machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}
TORCH_DTYPES["fp32"] = torch.float32
VOCAB = 50304
Fn = Callable[[], object]


class CollectError(RuntimeError):
    """An (op, dtype, shape) the device or this PyTorch build cannot run."""


def _rand(shape: tuple[int, ...], dtype: str, device: str) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=TORCH_DTYPES.get(dtype, torch.float32))


def _gemm_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    b, m, k, n = dims
    if dtype == "fp8":
        if device == "cpu" or b != 1 or m % 16 or n % 16 or k % 16:
            raise CollectError("fp8 needs a CUDA GPU, B = 1 and dims divisible by 16")
        a = _rand((m, k), "fp32", device).to(torch.float8_e4m3fn)
        w = _rand((n, k), "fp32", device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)  # tensor-wise scales
        return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    x, y = _rand((b, m, k), dtype, device), _rand((b, k, n), dtype, device)
    return lambda: torch.bmm(x, y)


def _attention_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    bh, sq, skv, d = dims
    q, k, v = (_rand((1, bh, s, d), dtype, device) for s in (sq, skv, skv))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v)


def _row_fn(op: str, dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    b, h = dims
    x = _rand((b, h), dtype, device)
    f = torch.nn.functional
    if op == "elementwise":
        y = _rand((b, h), dtype, device)
        return lambda: x + y
    if op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op == "layernorm":
        return lambda: f.layer_norm(x, (h,))
    if op == "rmsnorm":
        return lambda: f.rms_norm(x, (h,))
    table = _rand((VOCAB, h), dtype, device)
    ids = torch.randint(0, VOCAB, (b,), device=device)
    return lambda: f.embedding(ids, table)


def _adam_fn(dims: tuple[int, ...], dtype: str, device: str) -> Fn:
    p = torch.nn.Parameter(_rand((dims[0] * dims[1],), dtype, device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(
        [p], lr=1e-3, fused=device != "cpu", foreach=False if device == "cpu" else None
    )
    return opt.step


def build_fn(op: str, dtype: str, dims: tuple[int, ...], device: str) -> Fn:
    """A zero-argument callable that launches one kernel of ``op`` (a `CollectError` if not)."""
    if dtype == "tf32" and (device == "cpu" or op not in ("gemm", "bmm", "attention")):
        raise CollectError("tf32 is a CUDA tensor-core mode of matmuls")
    if dtype == "fp8" and op != "gemm":
        raise CollectError("fp8 is collected for gemm (torch._scaled_mm) only")
    if op in ("gemm", "bmm"):
        return _gemm_fn(dims, dtype, device)
    if op == "attention":
        return _attention_fn(dims, dtype, device)
    if op == "adam":
        return _adam_fn(dims, dtype, device)
    return _row_fn(op, dims, dtype, device)


@contextlib.contextmanager
def matmul_mode(dtype: str, device: str) -> Iterator[None]:
    """cuBLAS's TF32 switch (process-wide) on for ``tf32`` rows and off for the others while
    a row is built, timed and profiled; the caller's setting back afterwards."""
    if device == "cpu":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
