"""``tilesim predict --module FILE.py:FUNC``: load a user's builder, trace it, forecast it.

``FUNC(batch, seq)`` returns ``(module, args)``, ``(module, kwargs)`` or ``(module, args,
kwargs)`` (a tuple or list of positional inputs, a dict of keyword inputs); it runs under
``torch.device("meta")``, so building even a large model allocates nothing. The traced
blocks (`module_trace`) go through the same expansion (`opgraph.ops_from_blocks`) and
forecast (`e2e.graph_result`) as the analytic builders. Every failure of the user's code
becomes one `ConfigError` line, and what it prints goes to stderr (stdout is the forecast's,
one JSON object a run under ``--json``).

Memory estimate (the analytic builders' closed form needs a `ModelSpec`, which a module lacks):

* weights: the module's parameter and buffer bytes (a buffer, such as a causal mask, a rotary
  table or a KV cache, is held but never stepped); training adds, for the trainable
  parameters only (``requires_grad``), gradients (same bytes) and Adam (two fp32 moments,
  plus an fp32 master copy when parameters are 16-bit);
* activations, training: the bytes written by every forward kernel (views excluded), all kept
  for the backward pass (an upper bound, since autograd keeps only the tensors it needs), and
  the gradient of the largest output, which the backward holds beside them;
* activations, inference: twice the largest single kernel output (one op's input and output
  alive at once; everything else is freed as the forward goes).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forecast.flash_attention import has_flash_attention
from forecast.gpus import GPUSpec
from forecast.kernels import ITEMSIZE_BYTES
from forecast.predict import LatencyModel
from simulator.e2e import E2EResult, graph_result
from simulator.errors import ConfigError
from simulator.memory import MemoryEstimate, step_memory, usable_bytes
from simulator.opgraph import Workload, ops_from_blocks

if TYPE_CHECKING:
    from simulator.module_trace import ModuleTrace


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def load_builder(spec: str) -> Callable[..., Any]:
    """The function ``FUNC`` of ``FILE.py:FUNC``."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise ConfigError(f"--module takes FILE.py:FUNC, got {spec!r}")
    path = Path(path_text)
    if not path.is_file():
        what = "is a folder; give the .py file" if path.is_dir() else "does not exist"
        raise ConfigError(f"module file {path} {what}")
    folder = str(path.resolve().parent)  # its sibling files import, as under `python FILE.py`
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = f"tilesim_module_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"cannot import {path}: not a Python file")
    mod = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = mod  # dataclasses in the file look their module up here
    try:
        loader_spec.loader.exec_module(mod)
    except (Exception, SystemExit) as e:
        raise ConfigError(f"cannot import {path}: {_first_line(e)}") from e
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"{path} has no function {name!r}")
    return fn


def _unpack(call: str, built: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``(module, args)``, ``(module, kwargs)`` or ``(module, args, kwargs)`` as its three
    parts; anything else is one `ConfigError` naming what came back."""
    import torch

    parts = built if isinstance(built, tuple) else (built,)
    args: Any = parts[1] if len(parts) > 1 else None
    kwargs: Any = parts[2] if len(parts) == 3 else {}
    if len(parts) == 2 and isinstance(args, dict):
        args, kwargs = (), args
    ok = len(parts) in (2, 3) and isinstance(parts[0], torch.nn.Module)
    if not ok or not isinstance(args, tuple | list) or not isinstance(kwargs, dict):
        got = ", ".join(type(p).__name__ for p in parts)
        raise ConfigError(
            f"{call} must return (nn.Module, inputs): a tuple of positional inputs, a dict of "
            f"keyword inputs, or (module, args, kwargs); got ({got})"
        )
    return parts[0], tuple(args), kwargs


def trace_builder(spec: str, run: Workload, *, flash: bool = False) -> ModuleTrace:
    """Call ``FUNC(batch, seq)`` on the meta device and trace the module's forward;
    ``flash``: the GPU runs FlashAttention-2 (`module_trace.trace_module`)."""
    import torch

    from simulator.module_trace import (
        DTYPES,
        AutocastError,
        NoGradientOutputError,
        trace_module,
    )

    fn = load_builder(spec)
    call = f"{spec.rpartition(':')[2]}({run.batch}, {run.seq})"
    try:
        with torch.device("meta"):
            built = fn(run.batch, run.seq)
    except (Exception, SystemExit) as e:
        raise ConfigError(f"{call} raised {_first_line(e)}") from e
    module, args, kwargs = _unpack(call, built)
    odd = sorted(
        {str(p.dtype) for p in module.parameters() if p.is_floating_point()}
        - {str(d) for d in DTYPES}
    )
    if odd:
        raise ConfigError(
            f"{call}: parameters in {', '.join(odd)}; tilesim prices float32, bfloat16 and "
            "float16 modules: cast it in the builder (module.float() or .to(torch.bfloat16))"
        )
    try:
        with torch.device("meta"):
            return trace_module(module, args, train=run.mode == "train", kwargs=kwargs, flash=flash)
    except AutocastError:
        raise ConfigError(
            f"forward of {call} runs under torch.autocast, which the meta device ignores (it "
            "would be priced in its parameters' dtype); cast the module in the builder "
            "instead (module.to(torch.bfloat16))"
        ) from None
    except NoGradientOutputError as e:
        raise ConfigError(
            f"{call}: {e}; --mode train takes the gradient of a floating-point output (return "
            "the logits or the loss, not argmax), or use --mode inf"
        ) from None
    except (Exception, SystemExit) as e:
        raise ConfigError(f"forward of {call} raised {_first_line(e)}") from e


def module_memory(trace: ModuleTrace, run: Workload, gpu: GPUSpec) -> MemoryEstimate:
    """Weights, gradients, Adam state and activations (module docstring)."""
    train = run.mode == "train"
    largest = float(trace.largest_out_bytes)
    acts = trace.kernel_out_bytes + largest if train else 2.0 * largest
    n = float(trace.num_params)
    item = trace.param_bytes / n if n else float(ITEMSIZE_BYTES[trace.dtype])
    stepped = float(trace.trainable_params) if train else n
    mem = step_memory(
        num_params=stepped, item_bytes=item, train=train, activations_bytes=acts, gpu=gpu
    )
    # frozen parameters and buffers: held, no gradient, no Adam state
    frozen = item * (n - stepped) + trace.buffer_bytes
    total = mem.total_bytes + frozen
    update = {"weights_bytes": mem.weights_bytes + frozen, "total_bytes": total}
    return mem.model_copy(update={**update, "fits": total <= usable_bytes(gpu)})


def predict_module(
    spec: str, gpu: GPUSpec, run: Workload, latency_model: LatencyModel
) -> tuple[E2EResult, dict[str, int]]:
    """The ``tilesim predict`` result for a traced module, and its unmapped aten ops."""
    with contextlib.redirect_stdout(sys.stderr):  # the user's prints (module docstring)
        trace = trace_builder(spec, run, flash=has_flash_attention(gpu))
    run = run.model_copy(update={"dtype": trace.dtype})
    graph = ops_from_blocks(trace.blocks, run)
    return graph_result(graph, gpu, latency_model, module_memory(trace, run, gpu)), trace.unmapped
