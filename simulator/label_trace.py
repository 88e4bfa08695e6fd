"""NeuSight per-op traces (``labels/<GPU>/<run>.csv.gz``): a run's measured op times summed to
the full model, per op family.

Each row is one FX node of the Hugging Face model, timed as one PyTorch call (forward,
backward and gradient-accumulation ms). A trace holds one transformer layer (layer 0) and the
ops outside the layers; the full model is layer-0 rows x ``num_layer`` + the other rows (the
data's README). Switch's trace is the full model (``num_layer`` 0) and is summed as it is.

A row goes to the op family of the kernel it launches, read off what it calls: a module's
class (``Linear``, ``LayerNorm``, ...) or a function or method name (``addmm``, ``matmul``,
``softmax``, ``add``, ...). Rows that launch no kernel, views and shape arithmetic on Python
scalars, go to ``HOST``; a call named nowhere here counts as element-wise, the family of
torch's remaining pointwise kernels.
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from forecast.kernels import OpFamily
from simulator.errors import ConfigError

# Module path of the traced model's one transformer layer (GPT-2/GPT-3-style, BERT, OPT).
LAYER0 = re.compile(r"'(transformer\.h|bert\.encoder\.layer|model\.decoder\.layers)\.0'")
HOST = "host"  # no kernel: views, sizes, Python scalar arithmetic

_MODULES = {
    "Linear": OpFamily.LINEAR,
    "LayerNorm": OpFamily.LAYERNORM,
    "Softmax": OpFamily.SOFTMAX,
    "Embedding": OpFamily.MEMORY,
    "Dropout": OpFamily.MEMORY,
}
_CALLS = {
    "addmm": OpFamily.LINEAR,
    "linear": OpFamily.LINEAR,
    "bmm": OpFamily.BMM,
    "baddbmm": OpFamily.BMM,
    "softmax": OpFamily.SOFTMAX,
    "log_softmax": OpFamily.SOFTMAX,
    "logsumexp": OpFamily.SOFTMAX,
    "layer_norm": OpFamily.LAYERNORM,
    "embedding": OpFamily.MEMORY,
    "dropout": OpFamily.MEMORY,
    "contiguous": OpFamily.MEMORY,
    "clone": OpFamily.MEMORY,
    "cat": OpFamily.MEMORY,
    "setitem": OpFamily.MEMORY,
    "to": OpFamily.MEMORY,
    "type_as": OpFamily.MEMORY,
    # masking is memory-bound in the forecaster (as in `inventory_hf`): GPT-2's causal
    # torch.where, masked_fill, OPT's clamp of the scores (torch.max(scores, min))
    "where": OpFamily.MEMORY,
    "masked_fill": OpFamily.MEMORY,
    "masked_fill_": OpFamily.MEMORY,
    "max": OpFamily.MEMORY,
}
_VIEWS = frozenset(
    [
        "size",
        "dim",
        "getitem",
        "getattr",
        "view",
        "reshape",
        "permute",
        "transpose",
        "split",
        "unsqueeze",
        "squeeze",
        "expand",
    ]
)
_CLASS = re.compile(r"<class '([\w.]+)'>")
_CALLED = re.compile(r"(?:method|function) (\w+)")


def _scalars_only(shapes_text: str) -> bool:
    """True when every input is a Python scalar or a one-element tensor (``[[1]]``, ``[]``)."""
    try:
        shapes = json.loads(shapes_text or "[]")
    except json.JSONDecodeError:
        return False
    return all(len(s) <= 1 and all(d <= 1 for d in s) for s in shapes)


def row_call(row: Mapping[str, str]) -> str:
    """What a trace row calls: a module's class (``Dropout``), a function or method name
    (``dropout``, ``where``), or ``""`` for a row that calls nothing (placeholder, output)."""
    kind = row["op"]
    if kind == "call_module":
        classes = _CLASS.findall(row["meta"])
        return classes[-1].rsplit(".", 1)[-1] if classes else ""
    if kind not in ("call_function", "call_method"):
        return ""
    called = _CALLED.search(row["target"])
    return called.group(1) if called else row["target"]


def row_family(row: Mapping[str, str]) -> str:
    """The op family of one trace row, or ``HOST`` for a row that launches no kernel."""
    name = row_call(row)
    if row["op"] == "call_module":
        return _MODULES.get(name, OpFamily.ELEMENTWISE).value
    if not name:
        return HOST  # placeholder, get_attr, output
    target = row["target"]
    if name in _VIEWS or "torch.finfo" in target or _scalars_only(row.get("input_shapes", "")):
        return HOST
    if name == "matmul":
        shapes = json.loads(row["input_shapes"])
        return (OpFamily.LINEAR if len(shapes[-1]) == 2 else OpFamily.BMM).value
    return _CALLS.get(name, OpFamily.ELEMENTWISE).value


def _linear_dims(row: Mapping[str, str]) -> tuple[int, int, int, int]:
    """``(1, M, N, K)``, the kernel tables' linear convention (input ``(M, N)``, ``N -> K``
    features), of a linear-layer row."""
    shapes = json.loads(row["input_shapes"])
    if row["op"] == "call_module":
        x = shapes[0]
        out = ast.literal_eval(row["output_shape"])  # "(16, 512, 1024)"
        return 1, math.prod(x[:-1]), x[-1], out[-1]
    if len(shapes) == 3:  # addmm(bias, x, w): x (M, N), w (N, K)
        return 1, shapes[1][0], shapes[1][1], shapes[2][1]
    x, w = shapes[0], shapes[-1]  # matmul / linear(x, w): w (N, K) or (K, N)
    return 1, math.prod(x[:-1]), x[-1], w[1] if w[0] == x[-1] else w[0]


@contextmanager
def _rows(path: Path) -> Iterator[Iterator[dict[str, str]]]:
    """The rows of a gzipped trace CSV; a file that is not one (not gzip, truncated, a column
    missing, a time or shape that does not parse) is one `ConfigError` naming it."""
    try:
        with gzip.open(path, "rt", newline="") as f:
            yield csv.DictReader(f)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, KeyError, ValueError) as e:
        why = f"no column {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise ConfigError(
            f"{path}: not a NeuSight per-op trace ({why}); give the NeuSight data folder "
            "with --data"
        ) from e
    except (SyntaxError, IndexError, TypeError) as e:  # literal_eval and shape lists
        raise ConfigError(
            f"{path}: a row's shapes do not parse ({type(e).__name__}); give the NeuSight "
            "data folder with --data"
        ) from e


TABLED = (OpFamily.LINEAR.value, OpFamily.SOFTMAX.value, OpFamily.LAYERNORM.value)


def trace_kernels(path: Path) -> list[tuple[str, tuple[int, ...], float]]:
    """Every linear, softmax and layer-norm row of a trace, as the kernel tables write it:
    family, dims (``(1, M, N, K)`` or rows and width ``(B, H)``; the models normalise over
    the last dimension) and forward call time, ms."""
    out = []
    with _rows(path) as rows:
        for row in rows:
            fam = row_family(row)
            ms = float(row["fw_latency"] or 0.0)
            if fam not in TABLED or ms <= 0:
                continue
            if fam == OpFamily.LINEAR.value:
                dims: tuple[int, ...] = _linear_dims(row)
            else:
                x = json.loads(row["input_shapes"])[0]
                dims = (math.prod(x[:-1]), x[-1])
            out.append((fam, dims, ms))
    return out


def trace_backward_ms(path: Path, calls: frozenset[str]) -> list[tuple[tuple[int, int], float]]:
    """Rows of a trace that call one of ``calls`` (`row_call`) and have a backward time: the
    first input as ``(rows, width)`` and the backward ms."""
    out = []
    with _rows(path) as rows:
        for row in rows:
            ms = float(row["bw_latency"] or 0.0)
            if ms > 0 and row_call(row) in calls:
                x = json.loads(row["input_shapes"])[0]
                out.append(((math.prod(x[:-1]), x[-1]), ms))
    return out


PASS_COLUMNS = ("fw_latency", "bw_latency", "acc_latency")  # forward, backward, AccumulateGrad


def trace_family_ms(path: Path, num_layers: int) -> dict[str, float] | None:
    """Measured ms per op family (and ``HOST``) over the full model, forward + backward +
    gradient accumulation (`trace_sums`)."""
    sums = trace_sums(path, num_layers)
    return None if sums is None else sums[0]


def trace_pass_ms(path: Path, num_layers: int) -> dict[str, float] | None:
    """Measured ms of the full model's ``forward`` and ``backward`` (its backward kernels and
    gradient accumulation, as the label's ``bwall_latency`` times them) (`trace_sums`)."""
    sums = trace_sums(path, num_layers)
    return None if sums is None else sums[1]


def trace_sums(path: Path, num_layers: int) -> tuple[dict[str, float], dict[str, float]] | None:
    """A trace's measured ms over the full model, in one read: per op family (and ``HOST``),
    forward + backward + gradient accumulation; and per pass, ``forward`` and ``backward``
    (backward kernels + gradient accumulation). ``num_layers`` 0 marks a full-model trace
    (Switch's), summed as it is; otherwise layer-0 rows count ``num_layers`` times. None when
    the trace is absent or a one-layer trace has no layer-0 rows."""
    if not path.is_file() or num_layers < 0:
        return None
    layer: dict[tuple[str, str], float] = defaultdict(float)
    rest: dict[tuple[str, str], float] = defaultdict(float)
    with _rows(path) as rows:
        for row in rows:
            into = layer if num_layers > 0 and LAYER0.search(row["meta"]) else rest
            fw, bw, acc = (float(row[k] or 0.0) for k in PASS_COLUMNS)
            into["family", row_family(row)] += fw + bw + acc
            into["pass", "forward"] += fw
            into["pass", "backward"] += bw + acc
    if num_layers > 0 and sum(layer.values()) <= 0:
        return None
    full = {
        key: layer.get(key, 0.0) * num_layers + rest.get(key, 0.0)
        for key in sorted(layer.keys() | rest.keys())
    }
    by = {kind: {k: v for (c, k), v in full.items() if c == kind} for kind in ("family", "pass")}
    return by["family"], by["pass"]
