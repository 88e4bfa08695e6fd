"""What the collector measures and in which order: shapes of real transformer layers.

Shapes per op (mid-size first, then tile-boundary sizes that expose wave quantisation; tiny
ones on the CPU) and a plan that visits every (op, dtype) pair at its first shape before
any pair's second, so that a short time budget still covers every op and dtype. No timing
here: `forecast.profile` runs the plan.
"""

from __future__ import annotations

OPS: tuple[str, ...] = ("gemm", "bmm", "attention", "elementwise", "layernorm", "rmsnorm")
OPS += ("softmax", "embedding", "adam")
DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")


def _geo(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def op_shapes(op: str, device: str) -> list[tuple[int, ...]]:
    """Shapes of an op, in visiting order (mid-size first); tiny ones on the CPU."""
    if device == "cpu":
        return _CPU_SHAPES[op]
    shapes: list[tuple[int, ...]]
    hidden = [4096, 1024, 8192, 16384, 2048, 12288, 32768]
    tokens = [8192, 2048, 512, 32768, 131072]
    if op == "gemm":  # (1, M, reduction, N): QKV, out-proj, fc1, fc2, then wave edges
        layer: list[tuple[int, ...]] = [
            (1, t, h, m * h) for t in tokens for h in hidden for m in (3, 1, 4)
        ]
        layer += [(1, t, 4 * h, h) for t in tokens for h in hidden]
        edges: list[tuple[int, ...]] = [
            (1, n + e, n + e, n + e) for n in _geo(256, 8192) for e in (0, 1, 128)
        ]
        shapes = [s for s in layer if s[1] * s[2] * s[3] <= 2**43] + edges
    elif op in ("bmm", "attention"):
        shapes = [
            (bh, sq, d if op == "bmm" else sq, sq if op == "bmm" else d)
            for sq in [2048, 8192, 512, 32768, 131072]
            for d in (128, 64)
            for bh in _geo(32, 65536)
            if bh * sq * sq <= 2**37 and bh * sq <= 2**26
        ]
    elif op == "adam":
        shapes = [(1, n) for n in (2**24, 2**20, 2**27, 2**30)]
    else:
        shapes = [(t, h) for t in [*tokens, 65536] for h in hidden if t * h <= 2**31]
    return list(dict.fromkeys(shapes))  # once each: 8192^3 is a layer and a wave-edge cube


_CPU_SHAPES: dict[str, list[tuple[int, ...]]] = {
    "gemm": [(1, 64, 64, 64), (1, 129, 96, 64)],
    "bmm": [(4, 32, 16, 32), (8, 64, 32, 64)],
    "attention": [(4, 64, 64, 32), (2, 128, 128, 64)],
    "adam": [(1, 4096), (1, 65536)],
    **{op: [(64, 256), (128, 512)] for op in ("elementwise", "layernorm", "rmsnorm")},
    **{op: [(64, 256), (128, 512)] for op in ("softmax", "embedding")},
}


def plan(
    ops: tuple[str, ...], dtypes: tuple[str, ...], device: str
) -> list[tuple[str, str, tuple[int, ...]]]:
    """(op, dtype, dims) jobs, round-robin over (op, dtype) pairs by shape rank."""
    lists = {(op, dt): op_shapes(op, device) for op in ops for dt in dtypes}
    longest = max((len(v) for v in lists.values()), default=0)
    return [
        (op, dt, shapes[rank])
        for rank in range(longest)
        for (op, dt), shapes in lists.items()
        if rank < len(shapes)
    ]
