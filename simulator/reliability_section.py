"""A scenario's optional ``[reliability]`` table: interruptions and checkpoints, which turn a
procurement sweep's time to train into the expected wall time (`simulator.reliability`).

Without the table a run never fails (goodput 1), as before. Every number is the user's: no
catalog holds failure rates. One published reference, for scale: Llama 3 405B's pre-training
had 419 unexpected interruptions in a 54-day window on up to 16,384 H100s (Meta, "The Llama 3
Herd of Models", 2024, section 3.3.4), about 50,700 GPU-hours between interruptions.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forecast.kernels import Dtype
from simulator.errors import ConfigError
from simulator.memory import checkpoint_bytes
from simulator.models import ModelSpec
from simulator.reliability import Checkpointing, run_with_failures

_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)
MAX_HOURS = 1e9  # a GPU-MTBF past any fleet's (Llama 3: ~5e4) and small enough to stay finite
MAX_SECONDS = 1e9  # ~32 years: a checkpoint, restart or interval past it is a typo


class ReliabilitySection(BaseModel):
    """Interruptions and checkpoints (optional): with this table, time to train, cost and energy
    are the expected wall time of a run that is interrupted at random and resumes from its
    last checkpoint (J. T. Daly 2006), and each row has a goodput. Needs a token budget
    (sweep.train_tokens); give checkpoint_s or checkpoint_write_bytes_per_s."""

    model_config = _FROZEN
    gpu_mtbf_hours: float = Field(
        gt=0,
        le=MAX_HOURS,
        allow_inf_nan=False,
        description="mean hours between job interruptions per GPU (GPU, server, NIC and switch "
        "faults shared out): the job is interrupted every gpu_mtbf_hours / GPUs on average "
        "(Llama 3 405B: ~50,700, 419 interruptions in 54 days on 16,384 H100s); an option's "
        "own gpu_mtbf_hours replaces it",
    )
    restart_s: float = Field(
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="seconds from an interruption to training again: detection, replacing the "
        "node, relaunch, loading the checkpoint",
    )
    checkpoint_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="seconds training pauses to write one checkpoint (its blocking part, with "
        "asynchronous checkpoints)",
    )
    checkpoint_write_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        le=1e18,
        allow_inf_nan=False,
        description="instead of checkpoint_s: the cluster's write bandwidth to checkpoint "
        "storage; checkpoint_s = the training state's bytes (weights, the fp32 master copy of "
        "16-bit weights, two fp32 Adam moments) / this",
    )
    checkpoint_interval_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="seconds of training between checkpoints; default: the interval that "
        "minimises the expected time (Daly; sqrt(2 x checkpoint_s x job MTBF) to first order)",
    )

    @model_validator(mode="after")
    def _one_checkpoint_cost(self) -> ReliabilitySection:
        given = (self.checkpoint_s is not None) + (self.checkpoint_write_bytes_per_s is not None)
        if given != 1:
            how = "both" if given else "neither"
            raise ValueError(
                f"reliability: {how} of checkpoint_s and checkpoint_write_bytes_per_s given; "
                "give one (e.g. checkpoint_s = 60)"
            )
        return self


def checkpointing(
    section: ReliabilitySection,
    *,
    num_gpus: int,
    model: ModelSpec,
    dtype: Dtype,
    gpu_mtbf_hours: float | None = None,
    where: str = "reliability",
) -> Checkpointing:
    """The `Checkpointing` of a job of ``num_gpus`` GPUs training ``model`` in ``dtype``
    (``gpu_mtbf_hours``: an option's own, else the section's), checked to complete: a
    `ConfigError` naming ``where`` before any layout is simulated, not a sweep of error rows."""
    hours = section.gpu_mtbf_hours if gpu_mtbf_hours is None else gpu_mtbf_hours
    write_s = section.checkpoint_s
    if write_s is None:
        assert section.checkpoint_write_bytes_per_s is not None  # `_one_checkpoint_cost`
        state = checkpoint_bytes(model.num_params(), dtype)
        write_s = state / section.checkpoint_write_bytes_per_s
    c = Checkpointing(
        mtbf_s=hours * 3600.0 / num_gpus,
        checkpoint_s=write_s,
        restart_s=section.restart_s,
        interval_s=section.checkpoint_interval_s,
    )
    try:  # the optimum is under the MTBF; a given interval is what a long run takes
        run_with_failures(max(c.mtbf_s, c.interval_s or 0.0), c)
    except ConfigError as e:
        raise ConfigError(f"{where} ({num_gpus:,} GPUs): {str(e).partition(': ')[2]}") from e
    return c
