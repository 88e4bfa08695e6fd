"""Trace an arbitrary ``torch.nn.Module`` on the meta device into `FrameworkOp` blocks.

The forward runs on meta tensors (shapes and dtypes only: no memory, no GPU) under a
`TorchDispatchMode` that records every aten call; each call maps to an `oprules` constructor,
so backward kernels, parameter gradients and the optimizer come from the same rules as the
analytic inventories (`opgraph.ops_from_blocks` expands them). The mapping, stated once:

* ``addmm`` -> linear with bias; ``mm`` -> linear without bias when an operand is a parameter,
  else a ``bmm`` with batch 1; ``bmm``/``baddbmm`` -> bmm; ``convolution`` -> its implicit
  GEMM, a linear of (output pixels x ``C_in k``) @ (``C_in k`` x ``C_out``) (transposed:
  input pixels x ``C_in`` @ ``C_in`` x ``C_out k``), ``k`` the kernel's taps; a grouped one
  (depthwise: per group a sliver of a GEMM, memory-bound) stays unmapped, priced as a copy;
  ``_softmax``/``_log_softmax``/``_safe_softmax`` (``scaled_dot_product_attention`` on meta)
  -> softmax;
  ``native_layer_norm`` -> layernorm; ``embedding`` -> embedding;
  ``native_dropout`` -> dropout (meta takes CPU's unfused dropout path, so ``F.dropout`` and
  ``torch.dropout`` are routed to ``native_dropout``, the kernel CUDA runs);
* element-wise ops -> `ELEMENTWISE` (NeuSight names); a Python-scalar operand, or a
  broadcast operand at most a quarter of the output, selects the ``u`` form (``addu``);
* ``where``/``masked_fill`` -> masked_fill; ``maximum``/``minimum`` against a one-element
  tensor (a clamp, as OPT's ``torch.max(scores, finfo.min)``) -> maximum; copies (clone,
  _to_copy, copy_, cat) -> copy; fills (ones, zeros, full, arange, ...) -> fill; view-like
  ops and allocations launch no kernel and count as host ops;
* any other op with a tensor output -> a ``copy`` of its output, named in ``unmapped``.

A trainable parameter's gradient and optimizer state are charged once, to the first op that
reads it (or a view of it): tied weights are not counted twice; frozen ones
(``requires_grad=False``) not at all. Backward kernels follow autograd: an op none of whose
inputs depends on a trainable parameter (or an input that requires grad) has none, and a
GEMM computes the gradient of an operand (``dA``, ``dB``, the bias's) only when it needs one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from forecast.kernels import Dtype
from simulator import oprules as r
from simulator.opgraph import Block
from simulator.oprules import FrameworkOp


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: Dtype.FP32,
    torch.bfloat16: Dtype.BF16,
    torch.float16: Dtype.FP16,
}
VIEW_OPS = _names(
    "view _unsafe_view reshape _reshape_alias permute transpose t expand expand_as slice "
    "select unsqueeze squeeze split split_with_sizes unbind chunk narrow detach alias "
    "as_strided view_as unfold diagonal empty empty_like empty_strided new_empty lift_fresh"
)
COPY_OPS = _names("clone _to_copy copy_ copy cat contiguous")
FILL_OPS = _names(
    "ones zeros full fill_ fill zero_ ones_like zeros_like full_like arange scalar_tensor "
    "new_zeros new_ones new_full"
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


@dataclass(frozen=True, slots=True)
class ModuleTrace:
    """Traced blocks, ops without a rule (name -> count) and what the memory estimate needs."""

    blocks: tuple[Block, ...]
    unmapped: dict[str, int]
    num_params: int
    trainable_params: int  # of num_params, those with requires_grad (gradient, Adam state)
    param_bytes: int
    dtype: Dtype
    kernel_out_bytes: int  # bytes written by all forward kernels
    largest_out_bytes: int  # the largest single kernel output


class _Recorder(TorchDispatchMode):
    """Records aten calls and which tensors are parameters or views of them."""

    def __init__(self, params: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.params = params
        self.calls: list[Call] = []
        self.root = {i: i for i in params}  # id(parameter or a view of it) -> id(parameter)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        call = Call(func.overloadpacket.__name__, tuple(args), outs)
        first = _tensors(call)[:1]
        if call.op in VIEW_OPS and first and id(first[0]) in self.root:
            self.root.update({id(t): self.root[id(first[0])] for t in outs})
        self.calls.append(call)  # keeps the meta tensors alive, so their ids stay unique
        return out


class _NativeDropout(TorchFunctionMode):
    """Routes ``F.dropout`` and ``torch.dropout`` in training to ``aten.native_dropout``
    (CUDA's kernel)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.dropout or func is torch.dropout:
            named = dict(zip(("input", "p", "training"), args, strict=False)) | kwargs
            p, training = named.get("p", 0.5), named.get("training", named.get("train", True))
            if training and p > 0:
                return torch.ops.aten.native_dropout.default(named["input"], p, True)[0]
            return named["input"]
        return func(*args, **kwargs)


def _tensors(call: Call) -> list[torch.Tensor]:
    return [a for a in tree_flatten(call.args)[0] if isinstance(a, torch.Tensor)]


def _rows(t: torch.Tensor) -> tuple[int, int]:
    last = int(t.shape[-1]) if t.dim() else 1
    return max(1, t.numel() // max(1, last)), max(1, last)


def _elementwise(name: str, call: Call, dt: Dtype) -> FrameworkOp:
    op = ELEMENTWISE[call.op.rstrip("_")]
    n = call.outs[0].numel()
    small = [a for a in call.args if not isinstance(a, torch.Tensor) or 4 * a.numel() <= n]
    if op in U_FORM and small and len(call.args) >= 2:
        op += "u"
    return r.elementwise(name, op, _rows(call.outs[0]), dt)


def _gemm(name: str, call: Call, dt: Dtype, param: bool) -> FrameworkOp:
    if call.op in ("bmm", "baddbmm"):
        a, b = _tensors(call)[-2:]
        return r.bmm(name, (a.shape[0], a.shape[1], a.shape[2], b.shape[2]), dt)
    a, b = _tensors(call)[-2:]
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
    shape = _rows(call.outs[0])
    if call.op == "embedding":
        return r.embedding(name, call.args[1].numel(), tuple(call.args[0].shape), dt)
    if call.op == "native_dropout":
        return r.dropout(name, *shape, dt)
    if call.op.rstrip("_") in MASK_OPS:
        return r.memory(name, "masked_fill", shape, dt, bw_op="masked_fill")
    return r.memory(name, "fill" if call.op in FILL_OPS else "copy", shape, dt)


CLAMP_OPS = frozenset({"maximum", "minimum"})
# ``_safe_softmax``: the softmax of scaled_dot_product_attention's math path (torch >= 2.5)
SOFTMAX_OPS = frozenset({"_softmax", "_log_softmax", "_safe_softmax"})


def _clamp(name: str, call: Call, dt: Dtype) -> FrameworkOp | None:
    """``maximum(x, c)`` with ``c`` one element: `oprules.maximum` (``minimum``'s backward is
    the same five kernels); None (unmapped) for two full-size operands."""
    tensors = _tensors(call)
    if len(tensors) != 2 or min(t.numel() for t in tensors) > 1:
        return None
    return r.maximum(name, _rows(call.outs[0]), dt)


RULES: dict[str, Callable[[str, Call, Dtype, bool], FrameworkOp | None]] = {
    **{op: lambda n, c, d, p: _clamp(n, c, d) for op in CLAMP_OPS},
    **dict.fromkeys(("addmm", "mm", "bmm", "baddbmm"), _gemm),
    "convolution": lambda n, c, d, p: _conv(n, c, d),
    **{op: lambda n, c, d, p: _row_op(n, c, d) for op in SOFTMAX_OPS},
    "native_layer_norm": lambda n, c, d, p: _row_op(n, c, d),
    **{op: lambda n, c, d, p: _elementwise(n, c, d) for op in ELEMENTWISE},
    **{
        op: lambda n, c, d, p: _memory_op(n, c, d)
        for op in ("embedding", "native_dropout", *MASK_OPS, *COPY_OPS, *FILL_OPS)
    },
}


def _lookup(op: str) -> str | None:
    for name in (op, op.rstrip("_")):
        if name in RULES:
            return name
    return None


def _charge_params(fop: FrameworkOp, new: list[torch.Tensor]) -> FrameworkOp:
    """Parameters first read by this op: the rule's shapes when they cover the same elements
    (keeps kernels equal to the analytic builders'), else the tensors' own (rows, last)."""
    if not new:
        return replace(fop, params=())
    if sum(a * b for a, b in fop.params) == sum(t.numel() for t in new):
        return fop
    return replace(fop, params=tuple(_rows(t) for t in new))


# GEMM-shaped aten ops: whose gradient each backward kernel of the rule computes, by the
# position of the operand among the call's tensors (``addmm(bias, a, b)``: dA, dB, dbias)
GRAD_OPERANDS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("addmm", "baddbmm"), (1, 2, 0)),
    **dict.fromkeys(("mm", "bmm", "convolution"), (0, 1, 2)),
}


def _backward(fop: FrameworkOp, call: Call, needs: list[bool]) -> FrameworkOp:
    """``fop`` with only the backward kernels autograd runs (module docstring)."""
    if not any(needs):
        return replace(fop, bw=())
    operands = GRAD_OPERANDS.get(call.op)
    if operands is None:
        return fop
    keep = [needs[j] for j in operands if j < len(needs)]
    return replace(fop, bw=tuple(k for k, on in zip(fop.bw, keep, strict=False) if on))


def _blocks(
    rec: _Recorder, default: Dtype, grad: set[int]
) -> tuple[tuple[Block, ...], Counter[str], list[int]]:
    """The traced block; ``grad`` holds the ids of the tensors that need a gradient and
    grows with the outputs of every op that reads one."""
    fops: list[FrameworkOp] = []
    unmapped: Counter[str] = Counter()
    out_bytes: list[int] = []
    claimed: set[int] = set()
    host = 0
    for i, call in enumerate(rec.calls):
        needs = [id(t) in grad for t in _tensors(call)]
        if any(needs):
            grad.update(id(t) for t in call.outs)
        if call.op in VIEW_OPS or not call.outs:
            host += 1
            continue
        out = call.outs[0]
        dt = DTYPES.get(out.dtype, default)
        roots = [rec.root[id(t)] for t in _tensors(call) if id(t) in rec.root]
        trainable = [p for p in dict.fromkeys(roots) if rec.params[p].requires_grad]
        new = [rec.params[p] for p in trainable if p not in claimed]
        claimed.update(roots)
        rule = _lookup(call.op)
        fop = None if rule is None else RULES[rule](f"{call.op}_{i}", call, dt, bool(roots))
        if fop is None:
            unmapped[call.op] += 1
            fop = RULES["clone"](f"{call.op}_{i}", call, dt, bool(roots))
        assert fop is not None
        fops.append(_backward(_charge_params(fop, new), call, needs))
        out_bytes.append(sum(t.numel() * t.element_size() for t in call.outs))
    return (Block("module", tuple(fops), 1, host_ops=host),), unmapped, out_bytes


def trace_module(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    train: bool,
    kwargs: dict[str, Any] | None = None,
) -> ModuleTrace:
    """Run ``module(*args, **kwargs)`` on the meta device (train or eval mode) and map its
    aten ops."""
    module = module.to("meta").train(train)
    args, kwargs = tree_map_only(torch.Tensor, lambda a: a.to("meta"), (args, kwargs or {}))
    params: dict[int, torch.Tensor] = {id(p): p for p in module.parameters()}
    rec = _Recorder(params)
    with torch.set_grad_enabled(train), _NativeDropout(), rec:
        module(*args, **kwargs)
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    grad = {i for i, p in params.items() if p.requires_grad}
    grad |= {id(t) for t in inputs if t.requires_grad}
    counts = Counter(p.dtype for p in params.values() if p.dtype in DTYPES)
    # the dtype of most parameter tensors; a tie goes to the first in DTYPES (not to a set's
    # order, which changes from process to process with torch.dtype's hash)
    dtype = DTYPES[max(DTYPES, key=lambda d: counts[d])] if counts else Dtype.FP32
    blocks, unmapped, out_bytes = _blocks(rec, dtype, grad)
    return ModuleTrace(
        blocks=blocks,
        unmapped=dict(sorted(unmapped.items())),
        num_params=sum(p.numel() for p in params.values()),
        trainable_params=sum(p.numel() for p in params.values() if p.requires_grad),
        param_bytes=sum(p.numel() * p.element_size() for p in params.values()),
        dtype=dtype,
        kernel_out_bytes=sum(out_bytes),
        largest_out_bytes=max(out_bytes, default=0),
    )
