"""What a kernel is: its op family, its shape and its data type.

Shapes follow the NeuSight measurement schema so that a CSV row maps to a `KernelSpec`
without renaming:

* ``bmm``: dims ``(B, M, N, K)``: ``(B, M, N) @ (B, N, K) -> (B, M, K)``; ``N`` is the
  reduction dimension.
* ``linear``: dims ``(B, M, N, K)``: input ``(B*M, N)``, ``nn.Linear(N, K, bias=True)``,
  output ``(B*M, K)``; ``N`` is the reduction dimension. The data always has ``B = 1``.
* ``attention``: dims ``(BH, S_q, S_kv, D)``: batch x heads, query and key/value sequence
  lengths, head dim; non-causal flash attention (no S matrix in HBM). Op ``attention`` is the
  forward (Q, K, V read, O written; ``4 BH S_q S_kv D`` FLOPs), op ``attention_bwd`` the
  backward (Q, K, V, O, dO read, dQ, dK, dV written, plus an fp32 dQ accumulator;
  ``2.5x`` the forward FLOPs: five matmuls to the forward's two, flash-attention's convention).
  Ops ``attention_causal`` and ``attention_causal_bwd`` are the same kernels with
  ``causal=True`` (every decoder's self-attention): flash-attention >= 2.1 aligns the mask to
  the bottom right, query row ``r`` sees keys ``0 .. r + S_kv - S_q``, and FLOPs count only
  those unmasked pairs (`causal_pairs`: ``S (S + 1) / 2`` for ``S_q = S_kv = S``), the bytes
  stay the non-causal minimum (every operand still read once).
* ``elementwise``, ``softmax``, ``layernorm``, ``memory``: dims ``(B, H)``, a tensor of
  ``B`` rows of ``H`` elements; softmax and layer norm normalise over ``H``.

``op`` names the operator inside a family (``add``, ``gelu``, ``embedding``...). Where the
family has one operator it equals the family name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt


class OpFamily(StrEnum):
    """Op families; each has its own tile model and its own MLP."""

    BMM = "bmm"
    LINEAR = "linear"
    ELEMENTWISE = "elementwise"
    SOFTMAX = "softmax"
    LAYERNORM = "layernorm"
    MEMORY = "memory"
    ATTENTION = "attention"


class Dtype(StrEnum):
    """Element types; tensor-core types use the catalog's per-dtype peaks."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


ITEMSIZE_BYTES: dict[Dtype, int] = {
    Dtype.FP32: 4,
    Dtype.TF32: 4,
    Dtype.FP16: 2,
    Dtype.BF16: 2,
    Dtype.FP8: 1,
}

GEMM_FAMILIES = frozenset({OpFamily.BMM, OpFamily.LINEAR})
ROW_FAMILIES = frozenset(
    {OpFamily.ELEMENTWISE, OpFamily.SOFTMAX, OpFamily.LAYERNORM, OpFamily.MEMORY}
)

# Element-wise operators: (tensor inputs read, FLOPs per output element).
# The `u` suffix marks the tensor-with-Python-scalar form of the data ("addu" = x + 2.0).
ELEMENTWISE_OPS: dict[str, tuple[int, int]] = {
    "add": (2, 1),
    "mul": (2, 1),
    "div": (2, 1),
    "pow": (2, 1),
    "addu": (1, 1),
    "mulu": (1, 1),
    "divu": (1, 1),
    "powu": (1, 1),
    "relu": (1, 1),
    "gelu": (1, 8),
    "tanh": (1, 4),
}

# Memory-bound operators: (dtype-sized elements read, written) per element of (B, H).
MEMORY_OPS: dict[str, tuple[float, float]] = {
    "copy": (1.0, 1.0),
    "embedding": (1.0, 1.0),  # gather B rows of width H, write them
    "dropout": (1.0, 1.0),  # read x, write y (and a bool mask: `MASK_BYTES`)
    "dropout_backward": (1.0, 1.0),  # read dy (and the mask), write dx
    "masked_fill": (1.0, 1.0),  # mask or fill value broadcast (causal [1, 1, S, S], scalar)
    "masked_fill_full": (1.0, 1.0),  # a full-size bool mask (`MASK_BYTES`)
    "compare": (1.0, 0.0),  # x == / < / > a scalar tensor, writes a bool tensor
    "where": (2.0, 1.0),  # where(full-size bool, a, b)
    "fill": (0.0, 1.0),
}

# Bytes per element of a full-size bool tensor a memory-bound operator reads or writes,
# whatever the dtype of its other operands.
MASK_BYTES: dict[str, float] = {
    "dropout": 1.0,
    "dropout_backward": 1.0,
    "masked_fill_full": 1.0,
    "compare": 1.0,
    "where": 1.0,
}

FAMILY_OPS: dict[OpFamily, tuple[str, ...]] = {
    OpFamily.BMM: ("bmm",),
    OpFamily.LINEAR: ("linear",),
    OpFamily.ELEMENTWISE: tuple(ELEMENTWISE_OPS),
    OpFamily.SOFTMAX: ("softmax",),
    OpFamily.LAYERNORM: ("layernorm",),
    OpFamily.MEMORY: tuple(MEMORY_OPS),
    OpFamily.ATTENTION: (
        "attention",
        "attention_bwd",
        "attention_causal",
        "attention_causal_bwd",
    ),
}
ATTENTION_BACKWARD_OPS = frozenset({"attention_bwd", "attention_causal_bwd"})
CAUSAL_ATTENTION_OPS = frozenset({"attention_causal", "attention_causal_bwd"})

# FLOPs per element of the row families other than element-wise.
ROW_FLOPS_PER_ELEMENT: dict[OpFamily, int] = {
    OpFamily.SOFTMAX: 5,
    OpFamily.LAYERNORM: 8,
    OpFamily.MEMORY: 0,
}

# NeuSight `OPName` -> (family, op).
NEUSIGHT_OPS: dict[str, tuple[OpFamily, str]] = {
    "bmm": (OpFamily.BMM, "bmm"),
    "linear": (OpFamily.LINEAR, "linear"),
    "softmax": (OpFamily.SOFTMAX, "softmax"),
    "ln": (OpFamily.LAYERNORM, "layernorm"),
    **{name: (OpFamily.ELEMENTWISE, name) for name in ELEMENTWISE_OPS},
}


def resolve_op(op: str) -> tuple[OpFamily, str]:
    """Family and operator of an operator name: ``gelu`` -> (elementwise, gelu), ``ln`` ->
    (layernorm, layernorm); a family name stands for its first operator."""
    if op in NEUSIGHT_OPS:
        return NEUSIGHT_OPS[op]
    for family, ops in FAMILY_OPS.items():
        if op in ops:
            return family, op
        if op == family.value:
            return family, ops[0]
    known = sorted({*NEUSIGHT_OPS, *(o for ops in FAMILY_OPS.values() for o in ops)})
    raise ValueError(f"unknown op {op!r}; accepted: {', '.join(known)}")


def causal_pairs(s_q: int, s_kv: int) -> int:
    """Unmasked (query, key) pairs of a causal mask aligned to the bottom right
    (flash-attention >= 2.1): query row ``r`` sees keys ``0 .. r + S_kv - S_q``."""
    offset = s_kv - s_q
    if offset >= 0:
        return s_q * (s_q + 1) // 2 + s_q * offset
    return s_kv * (s_kv + 1) // 2  # the first S_q - S_kv rows see no key


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel launch: family, operator, shape and dtype. Hashable: a memo key."""

    family: OpFamily
    dims: tuple[int, ...]
    dtype: Dtype = Dtype.FP32
    op: str = ""

    def __post_init__(self) -> None:
        attention = self.family is OpFamily.ATTENTION
        expected = 4 if self.family in GEMM_FAMILIES or attention else 2
        if len(self.dims) != expected:
            names = "BH,S_q,S_kv,D" if attention else "B,M,N,K" if expected == 4 else "B,H"
            raise ValueError(
                f"{self.family.value} takes {expected} dims ({names}), got {len(self.dims)}"
            )
        if any(int(d) != d or d <= 0 for d in self.dims):
            raise ValueError(f"dims must be positive integers, got {self.dims}")
        op = self.op or FAMILY_OPS[self.family][0]
        if op not in FAMILY_OPS[self.family]:
            accepted = ", ".join(FAMILY_OPS[self.family])
            raise ValueError(f"op {op!r} is not in family {self.family.value}; use {accepted}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    @property
    def itemsize_bytes(self) -> int:
        """Bytes per element of this kernel's dtype."""
        return ITEMSIZE_BYTES[self.dtype]

    def flops(self) -> float:
        """Floating-point operations (an FMA counts 2)."""
        if self.family in GEMM_FAMILIES:
            B, M, N, K = self.dims
            bias = B * M * K if self.family is OpFamily.LINEAR else 0
            return float(2 * B * M * N * K + bias)
        if self.family is OpFamily.ATTENTION:
            bh, s_q, s_kv, d = self.dims
            matmuls = 5 if self.op in ATTENTION_BACKWARD_OPS else 2  # bwd: S, dP, dV, dK, dQ
            pairs = causal_pairs(s_q, s_kv) if self.op in CAUSAL_ATTENTION_OPS else s_q * s_kv
            return float(2 * matmuls * bh * pairs * d)  # 2 FLOPs per FMA
        B, H = self.dims
        if self.family is OpFamily.ELEMENTWISE:
            per_elem = ELEMENTWISE_OPS[self.op][1]
        else:
            per_elem = ROW_FLOPS_PER_ELEMENT[self.family]
        return float(per_elem * B * H)

    def bytes(self) -> float:
        """Minimum DRAM traffic: every operand read once and every result written once."""
        return float(self.shape_bytes(*self.dims))

    def shape_bytes(self, *dims: Any) -> Any:
        """`bytes` of a kernel of this family, op and dtype with dims ``dims``: ints, or
        float64 arrays (`batch_bytes` prices many at once)."""
        s = self.itemsize_bytes
        if self.family is OpFamily.BMM:
            B, M, N, K = dims
            return s * B * (M * N + N * K + M * K)
        if self.family is OpFamily.LINEAR:
            B, M, N, K = dims
            return s * (B * M * N + N * K + K + B * M * K)
        if self.family is OpFamily.ATTENTION:
            bh, s_q, s_kv, d = dims
            if self.op in ATTENTION_BACKWARD_OPS:  # Q, O, dO, dQ; K, V, dK, dV; fp32 dQ
                # zero, add and read
                return s * bh * d * (4 * s_q + 4 * s_kv) + 3 * 4 * bh * s_q * d
            return s * bh * d * (2 * s_q + 2 * s_kv)  # read Q, K, V; write O
        B, H = dims
        if self.family is OpFamily.ELEMENTWISE:
            reads, _ = ELEMENTWISE_OPS[self.op]
            return s * B * H * (reads + 1)
        if self.family is OpFamily.LAYERNORM:
            return s * (2 * B * H + 2 * H)
        if self.family is OpFamily.SOFTMAX:
            return s * 2 * B * H
        reads_w, writes_w = MEMORY_OPS[self.op]
        return B * H * (s * (reads_w + writes_w) + MASK_BYTES.get(self.op, 0.0))


# float64 holds every integer below this exactly.
_EXACT_BELOW = 2.0**53


def batch_bytes(
    like: KernelSpec, dims: npt.NDArray[np.int64], ops: list[str] | None = None
) -> npt.NDArray[np.float64]:
    """`KernelSpec.bytes` of kernels of ``like``'s family and dtype with (n, d) ``dims`` and
    operators ``ops`` (default: ``like``'s), bit for bit, in arrays (one `bytes` call a kernel
    was a seventh of a 100k-kernel forecast)."""
    if ops is None:
        return _op_bytes(like, dims)
    out = np.empty(len(dims), dtype=np.float64)
    for op, idx in indices_by_op(ops).items():
        out[idx] = _op_bytes(replace(like, op=op), dims[idx])
    return out


def indices_by_op(ops: list[str]) -> dict[str, list[int]]:
    """The positions of each operator in ``ops``, operators in order of first appearance (a
    batch of one family is priced one operator at a time)."""
    by_op: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        by_op[op].append(i)
    return by_op


def _op_bytes(like: KernelSpec, dims: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """`batch_bytes` of one operator. The formulas multiply and add positive integers (by
    factors of at least one), so a float64 result under 2^53 had every step exact; a kernel
    at or past it is priced in Python ints."""
    out = np.asarray(like.shape_bytes(*dims.T.astype(np.float64)), np.float64)
    for i in np.flatnonzero(out >= _EXACT_BELOW):
        out[i] = float(like.shape_bytes(*(int(d) for d in dims[i])))
    return out
