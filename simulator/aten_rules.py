"""Aten calls to `oprules` constructors: the rules `module_trace` applies to each recorded call.

The mapping, stated once:

* ``addmm`` -> linear with bias; ``mm`` -> linear without bias when an operand is a parameter,
  else a ``bmm`` with batch 1; ``bmm``/``baddbmm`` -> bmm; ``convolution`` -> its implicit
  GEMM, a linear of (output pixels x ``C_in k``) @ (``C_in k`` x ``C_out``) (transposed:
  input pixels x ``C_in`` @ ``C_in`` x ``C_out k``), ``k`` the kernel's taps; a grouped one
  (depthwise: per group a sliver of a GEMM, memory-bound) stays unmapped, priced as a copy;
  ``_softmax``/``_log_softmax``/``_safe_softmax`` (``scaled_dot_product_attention`` on meta)
  -> softmax;
  ``native_layer_norm`` -> layernorm; ``embedding`` -> embedding;
  ``_scaled_dot_product_flash_attention`` -> FlashAttention-2 (`oprules.flash_attention`;
  `module_trace` routes ``F.scaled_dot_product_attention`` there where CUDA would run it);
  ``native_dropout`` -> dropout (meta takes CPU's unfused dropout path, so ``F.dropout`` and
  ``torch.dropout`` are routed to ``native_dropout``, the kernel CUDA runs);
* element-wise ops -> `ELEMENTWISE` (NeuSight names); a Python-scalar operand, or a
  broadcast operand at most a quarter of the output, selects the ``u`` form (``addu``);
* ``where``/``masked_fill`` -> masked_fill; ``maximum``/``minimum`` against a one-element
  tensor (a clamp, as OPT's ``torch.max(scores, finfo.min)``) -> maximum; copies (clone,
  _to_copy, copy_, cat, stack) -> copy; fills (ones, zeros, full, arange, random draws such
  as ``bernoulli_``, ...) -> fill; view-like ops and allocations launch no kernel and count
  as host ops;
* any other op with a tensor output -> a ``copy`` of the largest tensor it reads or writes
  (a reduction reads all of its input, a pooling all of its window), with a ``copy`` of the
  same size backward (its input's gradient), named in ``unmapped`` (`unmapped_copy`, which
  `module_trace` applies where `lookup_rule` finds no rule or the rule returns None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from forecast.kernels import Dtype
from simulator import oprules as r
from simulator.oprules import FrameworkOp


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


VIEW_OPS = _names(
    "view _unsafe_view reshape _reshape_alias permute transpose t expand expand_as slice "
    "select unsqueeze squeeze split split_with_sizes unbind chunk narrow detach alias "
    "as_strided view_as unfold diagonal empty empty_like empty_strided new_empty lift_fresh "
    "unsafe_split unsafe_split_with_sizes unsafe_chunk view_as_real view_as_complex "
    "transpose_ t_ squeeze_ unsqueeze_ as_strided_"
)
COPY_OPS = _names("clone _to_copy copy_ copy cat contiguous stack")
FILL_OPS = _names(
    "ones zeros full fill_ fill zero_ ones_like zeros_like full_like arange scalar_tensor "
    "new_zeros new_ones new_full bernoulli rand rand_like randn randn_like"
)
MASK_OPS = frozenset({"where", "masked_fill"})
# aten element-wise op -> NeuSight op (forecast.kernels.ELEMENTWISE_OPS); the ops without a
# NeuSight kernel take the nearest one: one-input transcendentals run as ``tanh``.
ELEMENTWISE: dict[str, str] = {
    **{a: a for a in ("add", "mul", "div", "pow", "gelu", "relu", "tanh")},
    "sub": "add",
    "rsub": "add",
    "neg": "mulu",
    "reciprocal": "divu",
    "silu": "gelu",
    **dict.fromkeys(("sigmoid", "exp", "log", "sqrt", "rsqrt", "erf", "cos", "sin"), "tanh"),
}
U_FORM = frozenset({"add", "mul", "div", "pow"})  # NeuSight ops with a tensor-scalar form


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded aten call: op name, positional arguments, tensor outputs."""

    op: str
    args: tuple[Any, ...]
    outs: tuple[torch.Tensor, ...]


def call_tensors(call: Call) -> list[torch.Tensor]:
    """The tensors among a call's arguments, nested ones too, in order."""
    return [a for a in tree_flatten(call.args)[0] if isinstance(a, torch.Tensor)]


def row_shape(t: torch.Tensor) -> tuple[int, int]:
    """``(rows, last dim)`` of a tensor, each at least 1."""
    last = int(t.shape[-1]) if t.dim() else 1
    return max(1, t.numel() // max(1, last)), max(1, last)


def _elementwise(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    op = ELEMENTWISE[call.op.rstrip("_")]
    n = call.outs[0].numel()
    small = [a for a in call.args if not isinstance(a, torch.Tensor) or 4 * a.numel() <= n]
    if op in U_FORM and small and len(call.args) >= 2:
        op += "u"
    return r.elementwise(name, op, row_shape(call.outs[0]), dt)


def _gemm(name: str, call: Call, dt: Dtype, param: bool) -> FrameworkOp:
    if call.op in ("bmm", "baddbmm"):
        a, b = call_tensors(call)[-2:]
        return r.bmm(name, (a.shape[0], a.shape[1], a.shape[2], b.shape[2]), dt)
    a, b = call_tensors(call)[-2:]
    rows, n_in, n_out = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
    if call.op == "addmm":
        return r.linear(name, rows, (n_in, n_out), dt, bias=True)
    if param:
        return r.linear(name, rows, (n_in, n_out), dt, bias=False)
    return r.bmm(name, (1, rows, n_in, n_out), dt)


def _conv(name: str, call: Call, dt: Dtype) -> FrameworkOp | None:
    """``convolution(x, w, bias, stride, padding, dilation, transposed, out_pad, groups)`` as
    its implicit GEMM: ``2 N Ho Wo C_out C_in k`` FLOPs; None (unmapped) when grouped."""
    x, w, bias = call.args[:3]
    if int(call.args[8]) != 1:
        return None
    taps = prod(int(d) for d in w.shape[2:])
    if call.args[6]:  # transposed, w: (C_in, C_out, k...): an input pixel meets C_out k outputs
        rows, n_in, n_out = x.numel() // x.shape[1], w.shape[0], w.shape[1] * taps
    else:  # w: (C_out, C_in, k...): every output pixel reads C_in k inputs
        out = call.outs[0]
        rows, n_in, n_out = out.numel() // out.shape[1], w.shape[1] * taps, w.shape[0]
    return r.linear(name, rows, (n_in, n_out), dt, bias=bias is not None)


def _row_op(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    x = call.args[0]
    if call.op == "native_layer_norm":
        h = prod(int(d) for d in call.args[1])
        return r.layernorm(name, x.numel() // h, h, dt)
    n = int(x.shape[int(call.args[1])])
    return r.softmax(name, x.numel() // n, n, dt)


def _memory_op(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    shape = row_shape(call.outs[0])
    if call.op == "embedding":
        return r.embedding(name, call.args[1].numel(), tuple(call.args[0].shape), dt)
    if call.op == "native_dropout":
        return r.dropout(name, *shape, dt)
    if call.op.rstrip("_") in MASK_OPS:
        return r.memory(name, "masked_fill", shape, dt, bw_op="masked_fill")
    return r.memory(name, "fill" if call.op in FILL_OPS else "copy", shape, dt)


def unmapped_copy(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    """An op without a rule: a copy of the largest tensor it reads or writes, forward and
    backward (module docstring)."""
    big = max((*call_tensors(call), *call.outs), key=lambda t: t.numel())
    return r.memory(name, "copy", row_shape(big), dt, bw_op="copy")


def _flash(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    """``_scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, ...)``, q and k
    as (batch, heads, sequence, head dim)."""
    q, k = call.args[0], call.args[1]
    causal = bool(call.args[4]) if len(call.args) > 4 else False
    dims = (int(q.shape[0] * q.shape[1]), int(q.shape[2]), int(k.shape[2]), int(q.shape[3]))
    return r.flash_attention(name, dims, dt, causal=causal)


CLAMP_OPS = frozenset({"maximum", "minimum"})
# ``_safe_softmax``: the softmax of scaled_dot_product_attention's math path (torch >= 2.5)
SOFTMAX_OPS = frozenset({"_softmax", "_log_softmax", "_safe_softmax"})


def _clamp(name: str, call: Call, dt: Dtype) -> FrameworkOp | None:
    """``maximum(x, c)`` with ``c`` one element: `oprules.maximum` (``minimum``'s backward is
    the same five kernels); None (unmapped) for two full-size operands."""
    tensors = call_tensors(call)
    if len(tensors) != 2 or min(t.numel() for t in tensors) > 1:
        return None
    return r.maximum(name, row_shape(call.outs[0]), dt)


RULES: dict[str, Callable[[str, Call, Dtype, bool], FrameworkOp | None]] = {
    **{op: lambda n, c, d, p: _clamp(n, c, d) for op in CLAMP_OPS},
    **dict.fromkeys(("addmm", "mm", "bmm", "baddbmm"), _gemm),
    "convolution": lambda n, c, d, p: _conv(n, c, d),
    **{op: lambda n, c, d, p: _row_op(n, c, d) for op in SOFTMAX_OPS},
    "native_layer_norm": lambda n, c, d, p: _row_op(n, c, d),
    "_scaled_dot_product_flash_attention": lambda n, c, d, p: _flash(n, c, d),
    **{op: lambda n, c, d, p: _elementwise(n, c, d) for op in ELEMENTWISE},
    **{
        op: lambda n, c, d, p: _memory_op(n, c, d)
        for op in ("embedding", "native_dropout", *MASK_OPS, *COPY_OPS, *FILL_OPS)
    },
}


def lookup_rule(op: str) -> str | None:
    """The `RULES` key of an aten op (its in-place ``_`` suffix dropped), or None."""
    for name in (op, op.rstrip("_")):
        if name in RULES:
            return name
    return None
