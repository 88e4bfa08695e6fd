"""The latency-model interface and the batched forecast table the simulator consumes.

`LatencyModel` is the one interface with several implementations (roofline, tile-mlp).
`forecast_table` dedupes kernels and makes one `predict_s` call per GPU, which itself runs
one batched forward pass per op family (vidur's idea: forecast once, simulate many).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from forecast.gpus import GPUSpec
from forecast.kernels import KernelSpec
from forecast.roofline import RooflineModel

LatencyTable = dict[KernelSpec, float]
WEIGHTS_DIR = Path(__file__).parent / "data" / "weights"


class ModelError(ValueError):
    """Weights that are missing or cannot serve a request; the message names the fix."""


class LatencyModel(Protocol):
    """Predicts the latency of kernels run alone on one GPU."""

    name: str

    def predict_s(self, kernels: list[KernelSpec], gpu: GPUSpec) -> npt.NDArray[np.float64]:
        """Seconds per kernel, in input order."""
        ...


def _tile_mlp(weights_dir: Path | None) -> LatencyModel:
    from forecast.tile_mlp import TileMLPModel

    return TileMLPModel.load(weights_dir)


def _auto(weights_dir: Path | None) -> LatencyModel:
    """fp32 kernels via tile-mlp, tensor-core dtypes via the tensor-core/bandwidth models."""
    from forecast.dtype_router import DtypeRouter

    return DtypeRouter(lambda: _tile_mlp(weights_dir))


def _tensor_core(_weights: Path | None) -> LatencyModel:
    from forecast.tensor_core import TensorCoreModel

    return TensorCoreModel()


LATENCY_MODELS: dict[str, Callable[[Path | None], LatencyModel]] = {
    "roofline": lambda _weights: RooflineModel(),
    "tile-mlp": _tile_mlp,
    "auto": _auto,
    "tensor-core": _tensor_core,
}


def load_latency_model(kind: str = "tile-mlp", *, weights_dir: Path | None = None) -> LatencyModel:
    """A latency model by name: ``tile-mlp`` (trained weights) or ``roofline``."""
    if kind not in LATENCY_MODELS:
        raise ValueError(f"unknown latency model {kind!r}; use one of {', '.join(LATENCY_MODELS)}")
    return LATENCY_MODELS[kind](weights_dir)


def forecast_table(
    kernels: Iterable[KernelSpec], gpu: GPUSpec, model: LatencyModel
) -> LatencyTable:
    """Latency of every distinct kernel, from one batched call."""
    unique = sorted(set(kernels), key=lambda k: (k.family, k.op, k.dtype, k.dims))
    if not unique:
        return {}
    seconds = model.predict_s(unique, gpu)
    return dict(zip(unique, (float(s) for s in seconds), strict=True))
