"""A serving request (`ServeRequest`), the passes it runs and the checks it must pass.

One prefill pass over every prompt token (it writes the KV cache), then ``gen - 1`` decode
passes of one token per sequence; beyond `MAX_DECODE_SAMPLES` decode passes, that many evenly
spaced ones are forecast (`decode_samples`). `check_request` refuses, in one line naming the
flag, a request that cannot be forecast. `serve.forecast_passes` prices the passes.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from forecast.kernels import Dtype
from simulator.errors import ConfigError
from simulator.models import MAX_SEQ, ModelSpec
from simulator.opgraph import MAX_TOKENS, Workload
from topologies import Cluster


class ServeRequest(BaseModel):
    """A batch of generation requests on one GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(gt=0, strict=True)
    prompt: int = Field(gt=0, strict=True)  # tokens per prompt
    gen: int = Field(gt=0, strict=True)  # tokens generated per sequence (the first by prefill)
    # not hf-compile: generation under torch.compile is not modelled (`inventory_compile`)
    framework: Literal["megatron", "hf-eager"] = "megatron"
    dtype: Dtype = Dtype.BF16
    tp: int = Field(default=1, gt=0, strict=True)  # GPUs of one server sharing each layer


MAX_DECODE_SAMPLES = 256  # decode passes forecast one by one; beyond, interpolated


def decode_samples(gen: int) -> list[int]:
    """The decode passes (1 .. gen - 1) forecast: all of them up to `MAX_DECODE_SAMPLES`,
    else that many evenly spaced, the first and the last among them."""
    if gen - 1 <= MAX_DECODE_SAMPLES:
        return list(range(1, gen))
    return sorted({int(j) for j in np.rint(np.linspace(1, gen - 1, MAX_DECODE_SAMPLES))})


def prefill_pass(req: ServeRequest) -> Workload:
    """The prefill pass of ``req``: every prompt token, writing the KV cache."""
    return Workload(
        batch=req.batch,
        seq=req.prompt,
        mode="inf",
        framework=req.framework,
        dtype=req.dtype,
        kv_cache=True,
    )


def passes(req: ServeRequest) -> list[Workload]:
    """The prefill pass, then the sampled decode passes (`decode_samples`)."""
    prefill = prefill_pass(req)
    # decode pass j (1 .. gen - 1) feeds token prompt + j - 1 of each sequence
    decode = [
        Workload.model_validate({**prefill.model_dump(), "seq": 1, "past": req.prompt + j - 1})
        for j in decode_samples(req.gen)
    ]
    return [prefill, *decode]


def check_request(model: ModelSpec, req: ServeRequest, cluster: Cluster | None) -> None:
    """A `ConfigError` naming the flag where ``req`` cannot be forecast: a sequence past
    `MAX_SEQ` or the positions, a batch's context past `MAX_TOKENS`, a tp past the server."""
    context = req.prompt + req.gen - 1  # the position the last decode pass feeds
    if context > MAX_SEQ:
        flag = "--prompt" if req.prompt >= req.gen else "--gen"
        raise ConfigError(
            f"--prompt {req.prompt} + --gen {req.gen} - 1 = {context:,} tokens a sequence; "
            f"at most {MAX_SEQ:,} (2^27) are modelled: use a shorter {flag}"
        )
    try:
        model.check_sequence(context)
    except ConfigError as e:
        raise ConfigError(f"--prompt + --gen - 1 tokens: {e}") from None
    if req.batch * context > MAX_TOKENS:
        raise ConfigError(
            f"--batch {req.batch}: {req.batch} x {context} tokens of context = "
            f"{req.batch * context:.3g}; at most {MAX_TOKENS:.3g} (2^40) are modelled, use a "
            "smaller --batch"
        )
    if cluster is not None and req.tp > cluster.server.gpus_per_node:
        raise ConfigError(
            f"--tp {req.tp}: tensor parallelism stays inside one {cluster.server.id} "
            f"({cluster.server.gpus_per_node} GPUs); use --tp {cluster.server.gpus_per_node} "
            "or fewer"
        )
