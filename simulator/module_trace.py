"""Trace an arbitrary ``torch.nn.Module`` on the meta device into `FrameworkOp` blocks.

The forward runs on meta tensors (shapes and dtypes only: no memory, no GPU) under a
`TorchDispatchMode` that records every aten call; each call maps to an `oprules` constructor
(the mapping, stated once, is `aten_rules`'s), so backward kernels, parameter gradients and
the optimizer come from the same rules as the analytic inventories (`opgraph.ops_from_blocks`
expands them).

A trainable parameter's gradient and optimizer state are charged once, to the first op that
reads it (or a view of it) with grad mode on: tied weights are not counted twice; frozen ones
(``requires_grad=False``), and those read only under ``torch.no_grad()``, not at all (they get
no ``.grad``, and Adam skips them). Backward kernels follow autograd: an op none of whose
inputs depends on a trainable parameter (or an input that requires grad) has none, nor has an
op run under ``torch.no_grad()``, or one whose outputs never reach the module's outputs (a
``detach`` cuts the chain); a GEMM computes the gradient of an operand (``dA``, ``dB``, the
bias's) only when it needs one.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from forecast.kernels import Dtype
from simulator.aten_rules import (
    RULES,
    VIEW_OPS,
    Call,
    call_tensors,
    lookup_rule,
    row_shape,
    unmapped_copy,
)
from simulator.opgraph import Block
from simulator.oprules import FrameworkOp

DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: Dtype.FP32,
    torch.bfloat16: Dtype.BF16,
    torch.float16: Dtype.FP16,
}


@dataclass(frozen=True, slots=True)
class ModuleTrace:
    """Traced blocks, ops without a rule (name -> count) and what the memory estimate needs."""

    blocks: tuple[Block, ...]
    unmapped: dict[str, int]
    num_params: int
    trainable_params: int  # of num_params, those that get a gradient (and Adam state)
    param_bytes: int
    dtype: Dtype
    buffer_bytes: int  # registered buffers (masks, rotary tables, caches): held, never stepped
    kernel_out_bytes: int  # bytes written by all forward kernels
    largest_out_bytes: int  # the largest single kernel output


class _Recorder(TorchDispatchMode):
    """Records aten calls and which tensors are parameters or views of them."""

    def __init__(self, params: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.params = params
        self.calls: list[Call] = []
        self.grad_on: list[bool] = []  # grad mode at each call (``torch.no_grad()`` blocks)
        self.root = {i: i for i in params}  # id(parameter or a view of it) -> id(parameter)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in GRAD_OPERANDS:  # CUDA refuses mixed operands; meta computed them
            kinds = {t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point()}
            if len(kinds) > 1:
                raise RuntimeError(
                    f"{name} of {' and '.join(sorted(map(str, kinds)))} operands, which CUDA "
                    "refuses: give the inputs the module's dtype in the builder"
                )
        out = func(*args, **(kwargs or {}))
        outs = tuple(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        call = Call(name, tuple(args), outs)
        first = call_tensors(call)[:1]
        if call.op in VIEW_OPS and first and id(first[0]) in self.root:
            self.root.update({id(t): self.root[id(first[0])] for t in outs})
        self.calls.append(call)  # keeps the meta tensors alive, so their ids stay unique
        self.grad_on.append(torch.is_grad_enabled() and call.op != "detach")
        return out


class _CudaRoutes(TorchFunctionMode):
    """Routes calls whose meta decomposition differs from the kernels CUDA runs: ``F.dropout``
    and ``torch.dropout`` in training to ``aten.native_dropout`` (CUDA's kernel; meta takes
    CPU's unfused path), and with ``flash`` (a GPU FlashAttention-2 runs on)
    ``F.scaled_dot_product_attention`` in 16 bits to ``aten._scaled_dot_product_flash_attention``
    (`_flash_sdpa`) instead of its math path (meta's: q, k and v cast to fp32, the whole score
    matrix in two bmm and a softmax). Refuses autocast, which meta tensors ignore.

    A mode does not see the calls inside a function it handles (``nn.MultiheadAttention``
    calls ``scaled_dot_product_attention`` from ``F.multi_head_attention_forward``), so while
    it is active ``torch.nn.functional.scaled_dot_product_attention`` is also replaced by the
    routed one; the mode catches a reference taken before (``from torch.nn.functional import
    scaled_dot_product_attention``)."""

    def __init__(self, *, flash: bool) -> None:
        super().__init__()
        self.flash = flash
        self.sdpa = F.scaled_dot_product_attention

    def __enter__(self) -> _CudaRoutes:
        if self.flash:
            F.scaled_dot_product_attention = self._routed_sdpa
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self.sdpa
        super().__exit__(*exc)

    def _routed_sdpa(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        routed = _flash_sdpa(dict(zip(SDPA_ARGS, args, strict=False)) | kwargs)
        return self.sdpa(*args, **kwargs) if routed is None else routed

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
            raise AutocastError
        if func is F.dropout or func is torch.dropout:
            named = dict(zip(("input", "p", "training"), args, strict=False)) | kwargs
            p, training = named.get("p", 0.5), named.get("training", named.get("train", True))
            if training and p > 0:
                return torch.ops.aten.native_dropout.default(named["input"], p, True)[0]
            return named["input"]
        if func is self.sdpa and self.flash:
            return self._routed_sdpa(*args, **kwargs)
        return func(*args, **kwargs)


SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256  # FlashAttention-2's largest head dimension


def _flash_sdpa(named: dict[str, Any]) -> torch.Tensor | None:
    """PyTorch's flash backend for ``scaled_dot_product_attention`` where it takes the call
    (fp16/bf16, 4-d, no explicit mask, head dim at most 256, as many key as query heads or,
    with ``enable_gqa``, a divisor of them: FA2 reads a group's keys once), else None (the
    math path)."""
    q, k, v = named["query"], named["key"], named["value"]
    if not (
        q.dtype in FLASH_DTYPES
        and q.dim() == k.dim() == v.dim() == 4
        and named.get("attn_mask") is None
        and q.shape[-1] <= FLASH_MAX_HEAD_DIM
        and k.shape[1] == v.shape[1]
        and (q.shape[1] == k.shape[1] or (named.get("enable_gqa") and q.shape[1] % k.shape[1] == 0))
    ):
        return None
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        q,
        k,
        v,
        float(named.get("dropout_p", 0.0)),
        bool(named.get("is_causal", False)),
        False,
        scale=named.get("scale"),
    )
    return out[0]


class AutocastError(RuntimeError):
    """The module ran under ``torch.autocast``, which meta tensors ignore (it would be priced
    in the parameters' dtype)."""


def _charge_params(fop: FrameworkOp, new: list[torch.Tensor]) -> FrameworkOp:
    """Parameters first read by this op: the rule's shapes when they cover the same elements
    (keeps kernels equal to the analytic builders'), else the tensors' own (rows, last)."""
    if not new:
        return replace(fop, params=())
    if sum(a * b for a, b in fop.params) == sum(t.numel() for t in new):
        return fop
    return replace(fop, params=tuple(row_shape(t) for t in new))


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


def _reaching(rec: _Recorder, outputs: list[torch.Tensor]) -> set[int]:
    """Ids of the tensors the module's floating-point outputs depend on through grad-mode
    calls that return floating-point tensors: the ones a backward from the outputs visits
    (an integer result, such as ``argmax``'s, has no gradient to pass back)."""
    live = {id(t) for t in outputs if _differentiable(t)}
    for call, grad_on in zip(reversed(rec.calls), reversed(rec.grad_on), strict=True):
        if grad_on and any(id(t) in live and _differentiable(t) for t in call.outs):
            live.update(id(t) for t in call_tensors(call))
    return live


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


class NoGradientOutputError(ValueError):
    """A module traced for training whose outputs are all integer tensors: PyTorch's backward
    from them raises, where tilesim priced one."""


def _blocks(
    rec: _Recorder, default: Dtype, grad: set[int], live: set[int]
) -> tuple[tuple[Block, ...], Counter[str], list[int], set[int]]:
    """The traced block, unmapped ops, output bytes and the ids of the parameters that get a
    gradient; ``grad`` holds the ids of the tensors that need a gradient and grows with the
    outputs of every op that reads one with grad mode on; ``live`` (`_reaching`) the ids of
    those a backward from the outputs visits."""
    fops: list[FrameworkOp] = []
    unmapped: Counter[str] = Counter()
    out_bytes: list[int] = []
    claimed: set[int] = set()
    host = 0
    for i, (call, grad_on) in enumerate(zip(rec.calls, rec.grad_on, strict=True)):
        grad_on = grad_on and any(id(t) in live for t in call.outs)
        needs = [grad_on and id(t) in grad for t in call_tensors(call)]
        if any(needs):
            grad.update(id(t) for t in call.outs)
        if call.op in VIEW_OPS or not call.outs:
            host += 1
            continue
        out = call.outs[0]
        dt = DTYPES.get(out.dtype, default)
        roots = [rec.root[id(t)] for t in call_tensors(call) if id(t) in rec.root]
        trainable = [p for p in dict.fromkeys(roots) if rec.params[p].requires_grad and grad_on]
        new = [rec.params[p] for p in trainable if p not in claimed]
        claimed.update(trainable)
        rule = lookup_rule(call.op)
        fop = None if rule is None else RULES[rule](f"{call.op}_{i}", call, dt, bool(roots))
        if fop is None:
            unmapped[call.op] += 1
            fop = unmapped_copy(f"{call.op}_{i}", call, dt)
        fops.append(_backward(_charge_params(fop, new), call, needs))
        out_bytes.append(sum(t.numel() * t.element_size() for t in call.outs))
    return (Block("module", tuple(fops), 1, host_ops=host),), unmapped, out_bytes, claimed


def trace_module(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    train: bool,
    kwargs: dict[str, Any] | None = None,
    flash: bool = False,
) -> ModuleTrace:
    """Run ``module(*args, **kwargs)`` on the meta device (train or eval mode) and map its
    aten ops; ``flash``: the GPU runs FlashAttention-2 (`_CudaRoutes`)."""
    module = module.to("meta").train(train)
    args, kwargs = tree_map_only(torch.Tensor, lambda a: a.to("meta"), (args, kwargs or {}))
    params: dict[int, torch.Tensor] = {id(p): p for p in module.parameters()}
    rec = _Recorder(params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.set_grad_enabled(train), _CudaRoutes(flash=flash), rec:
            result = module(*args, **kwargs)
    for w in caught:  # torch.autocast("cuda") without CUDA disables itself with a warning
        if "autocast" in str(w.message).lower():
            raise AutocastError
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    if train and not any(_differentiable(t) for t in outputs):
        kinds = ", ".join(sorted({str(t.dtype) for t in outputs})) or "no tensor"
        raise NoGradientOutputError(f"its outputs ({kinds}) carry no gradient")
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    grad = {i for i, p in params.items() if p.requires_grad}
    grad |= {id(t) for t in inputs if t.requires_grad}
    counts = Counter(p.dtype for p in params.values() if p.dtype in DTYPES)
    # the dtype of most parameter tensors; a tie goes to the first in DTYPES (not to a set's
    # order, which changes from process to process with torch.dtype's hash)
    dtype = DTYPES[max(DTYPES, key=lambda d: counts[d])] if counts else Dtype.FP32
    blocks, unmapped, out_bytes, stepped = _blocks(rec, dtype, grad, _reaching(rec, outputs))
    return ModuleTrace(
        blocks=blocks,
        unmapped=dict(sorted(unmapped.items())),
        num_params=sum(p.numel() for p in params.values()),
        trainable_params=sum(params[i].numel() for i in stepped),
        param_bytes=sum(p.numel() * p.element_size() for p in params.values()),
        buffer_bytes=sum(b.numel() * b.element_size() for b in module.buffers()),
        dtype=dtype,
        kernel_out_bytes=sum(out_bytes),
        largest_out_bytes=max(out_bytes, default=0),
    )
