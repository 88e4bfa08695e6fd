"""Framework ops and their backward rules: one `FrameworkOp` per PyTorch-level operator.

Each constructor states the kernels an op launches forward and backward and the parameter
tensors it owns (for gradient accumulation and the optimizer). Backward rules:

* linear ``y = x W + b``: dgrad GEMM ``(T, n_out) @ W^T`` and wgrad GEMM ``x^T @ dy``, both as
  linear-shaped kernels, plus the bias gradient: a column reduction of ``dy``, modelled as a
  ``copy`` of half of ``dy`` (it reads ``dy`` once and writes one row).
* bmm ``C = A B``: ``dA = dC B^T`` and ``dB = A^T dC``, two bmm kernels.
* layer norm: one layer-norm-family kernel with 1.5x the rows (reads ``x`` and ``dy``,
  writes ``dx``: three tensors where the forward moves two), plus the parameter-gradient
  reduction (a ``copy`` of ``(T, H)`` read once).
* softmax: one softmax-family kernel (``y``, ``dy`` -> ``dx``) plus an element-wise ``mul``
  (the ``y * dy`` product the eager kernel materialises); the traces show ~2.5x the forward.
* dropout: forward writes the output and a bool mask; backward is one masked scale of the
  gradient by the saved mask (``dropout_backward``, a slow kernel: `forecast.bandwidth`);
  ``masked_fill``/``where`` with a broadcast mask: a ``masked_fill`` of the gradient;
  ``torch.max(x, c)`` with a constant tensor ``c`` (OPT's clamp of the scores): autograd's
  five kernels ``g / 2``, ``x == c``, ``where``, ``x < c``, ``masked_fill_`` (derivatives.yaml's
  ``maximum`` rule, checked with a dispatch trace); unary element-wise ops: one element-wise
  kernel each (``tanh`` and ``gelu`` read input and gradient: ``mul``-shaped); ``pow``: three
  kernels.
* embedding: zero-fill of the ``(V, H)`` gradient plus an ``embedding`` scatter of ``(T, H)``.
* flash attention: FlashAttention-2's backward kernel (``attention_bwd``).
* additions: no backward kernel (the gradient passes through).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from forecast.kernels import Dtype, KernelSpec, OpFamily

Shape = tuple[int, int]


@dataclass(frozen=True, slots=True)
class FrameworkOp:
    """One framework-level operator: forward kernels, backward kernels, parameters."""

    name: str
    fw: tuple[KernelSpec, ...]
    bw: tuple[KernelSpec, ...] = ()
    params: tuple[Shape, ...] = ()
    train_only: bool = False
    # of ``params``, those that are another op's tensor (an output head tied to the token
    # embedding): their gradient still adds in, the optimizer steps them once, with the owner
    tied: tuple[Shape, ...] = ()


def tie(fop: FrameworkOp, when: bool = True) -> FrameworkOp:
    """``fop`` with its weight (its first parameter) tied to another op's, when ``when``."""
    return replace(fop, tied=fop.params[:1]) if when else fop


def _k(family: OpFamily, dims: tuple[int, ...], dtype: Dtype, op: str = "") -> KernelSpec:
    return KernelSpec(family, tuple(max(1, int(d)) for d in dims), dtype, op)


def linear(name: str, rows: int, dims: Shape, dtype: Dtype, *, bias: bool = True) -> FrameworkOp:
    """``nn.Linear(n_in, n_out)`` on ``rows`` tokens; ``dims = (n_in, n_out)``."""
    n_in, n_out = dims
    lin = OpFamily.LINEAR
    bw = [_k(lin, (1, rows, n_out, n_in), dtype), _k(lin, (1, n_out, rows, n_in), dtype)]
    if bias:
        bw.append(_k(OpFamily.MEMORY, (rows // 2, n_out), dtype, "copy"))
    params = ((n_in, n_out), (1, n_out)) if bias else ((n_in, n_out),)
    return FrameworkOp(name, (_k(lin, (1, rows, n_in, n_out), dtype),), tuple(bw), params)


def bmm(name: str, dims: tuple[int, int, int, int], dtype: Dtype) -> FrameworkOp:
    """``(B, M, N) @ (B, N, K)``."""
    B, M, N, K = dims
    bw = (_k(OpFamily.BMM, (B, M, K, N), dtype), _k(OpFamily.BMM, (B, N, M, K), dtype))
    return FrameworkOp(name, (_k(OpFamily.BMM, dims, dtype),), bw)


def layernorm(name: str, rows: int, h: int, dtype: Dtype) -> FrameworkOp:
    """``nn.LayerNorm(h)`` with weight and bias."""
    bw = (
        _k(OpFamily.LAYERNORM, (rows * 3 // 2, h), dtype),
        _k(OpFamily.MEMORY, (rows // 2, h), dtype, "copy"),
    )
    return FrameworkOp(name, (_k(OpFamily.LAYERNORM, (rows, h), dtype),), bw, ((1, h), (1, h)))


def softmax(name: str, rows: int, h: int, dtype: Dtype) -> FrameworkOp:
    """Softmax over the last dimension."""
    bw = (_k(OpFamily.SOFTMAX, (rows, h), dtype), _k(OpFamily.ELEMENTWISE, (rows, h), dtype, "mul"))
    return FrameworkOp(name, (_k(OpFamily.SOFTMAX, (rows, h), dtype),), bw)


def flash_attention(
    name: str, dims: tuple[int, int, int, int], dtype: Dtype, *, causal: bool
) -> FrameworkOp:
    """FlashAttention-2 over ``dims = (batch x heads, S_q, S_kv, head dim)``: one forward and
    one backward kernel of the attention family (causal: the blocks under the diagonal)."""
    fw, bw = (
        ("attention_causal", "attention_causal_bwd") if causal else ("attention", "attention_bwd")
    )
    return FrameworkOp(
        name, (_k(OpFamily.ATTENTION, dims, dtype, fw),), (_k(OpFamily.ATTENTION, dims, dtype, bw),)
    )


def dropout(name: str, rows: int, h: int, dtype: Dtype) -> FrameworkOp:
    """Training-mode dropout (eval mode launches nothing)."""
    fw = (_k(OpFamily.MEMORY, (rows, h), dtype, "dropout"),)
    bw = (_k(OpFamily.MEMORY, (rows, h), dtype, "dropout_backward"),)
    return FrameworkOp(name, fw, bw, train_only=True)


def maximum(name: str, shape: Shape, dtype: Dtype) -> FrameworkOp:
    """``torch.max(x, c)``, ``c`` a constant 0-d tensor (no gradient of its own)."""
    mem = [_k(OpFamily.MEMORY, shape, dtype, op) for op in ("compare", "where")]
    bw = (
        _k(OpFamily.ELEMENTWISE, shape, dtype, "divu"),
        *mem,
        mem[0],
        _k(OpFamily.MEMORY, shape, dtype, "masked_fill_full"),
    )
    return FrameworkOp(name, (_k(OpFamily.MEMORY, shape, dtype, "copy"),), bw)


def memory(name: str, op: str, shape: Shape, dtype: Dtype, *, bw_op: str = "") -> FrameworkOp:
    """A memory-bound op (copy, masked_fill, fill...); ``bw_op`` its backward, if any."""
    bw = (_k(OpFamily.MEMORY, shape, dtype, bw_op),) if bw_op else ()
    return FrameworkOp(name, (_k(OpFamily.MEMORY, shape, dtype, op),), bw)


# Backward kernels of element-wise ops (NeuSight op names); absent = no kernel.
ELEMENTWISE_BACKWARD: dict[str, tuple[str, ...]] = {
    "add": (),
    "addu": (),
    "mul": ("mul", "mul"),
    "mulu": ("mulu",),
    "div": ("div", "div", "mul"),
    "divu": ("divu",),
    "powu": ("powu", "mulu", "mul"),
    "pow": ("pow", "mul", "mul"),  # tensor exponent: dx = y x^(y-1), dy = x^y ln x
    "relu": ("mul",),
    "gelu": ("mul",),
    "tanh": ("mul",),
}


def elementwise(name: str, op: str, shape: Shape, dtype: Dtype) -> FrameworkOp:
    """An element-wise op with the backward kernels of `ELEMENTWISE_BACKWARD`."""
    bw = tuple(_k(OpFamily.ELEMENTWISE, shape, dtype, b) for b in ELEMENTWISE_BACKWARD[op])
    return FrameworkOp(name, (_k(OpFamily.ELEMENTWISE, shape, dtype, op),), bw)


def embedding(name: str, rows: int, table: Shape, dtype: Dtype) -> FrameworkOp:
    """``nn.Embedding(V, H)`` gathering ``rows`` rows."""
    H = table[1]
    bw = (
        _k(OpFamily.MEMORY, table, dtype, "fill"),
        _k(OpFamily.MEMORY, (rows, H), dtype, "embedding"),
    )
    return FrameworkOp(name, (_k(OpFamily.MEMORY, (rows, H), dtype, "embedding"),), bw, (table,))
