"""The prices of one training step's tasks, as plain seconds: `ChunkCost` per model chunk and
stage, `StepCosts` for the step, and the cost keys the execution graph (`simulator.execgraph`)
names on its nodes and timed edges. `StepCosts.seconds` prices a key:

* ``("task", stage, chunk, phase, n)``: one of ``n`` equal pieces of a forward (``"F"``) or
  backward (``"B"``) of one chunk for one micro-batch (all its `ChunkCost.parts`);
* ``("grad_sync", stage, chunk, n)``: one of ``n`` buckets of the chunk's gradient reduction;
* ``("zero3_gather", stage, chunk)`` / ``("zero3_scatter", stage, chunk)``: one ZeRO-3
  parameter all-gather or gradient reduce-scatter;
* ``("optimizer", stage)`` / ``("param_gather", stage)``: the optimizer step and the
  all-gather of updated parameters after it;
* ``("norm_sync", stage)``: sequence parallelism's norm-gradient all-reduce over the TP
  group (`simulator.finalize_grads`);
* ``("embedding_sync",)``: the tied word embedding's gradient all-reduce between the first
  and the last stage (`simulator.finalize_grads`);
* `PP_HOP`: one pipeline send-recv.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CostKey = tuple[Any, ...]
PP_HOP: CostKey = ("pp_hop",)
EMBEDDING_SYNC: CostKey = ("embedding_sync",)


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Per-micro-batch costs of one model chunk on one stage, seconds."""

    fw_compute_s: float
    bw_compute_s: float
    fw_tp_s: float = 0.0
    bw_tp_s: float = 0.0
    fw_ep_s: float = 0.0
    bw_ep_s: float = 0.0
    fw_cp_s: float = 0.0
    bw_cp_s: float = 0.0
    grad_sync_s: float = 0.0  # whole chunk, all its buckets, once per step (ZeRO-0/1/2)
    zero3_gather_s: float = 0.0  # per task
    zero3_scatter_s: float = 0.0  # per backward
    fw_dp_s: float = 0.0  # blocking ZeRO-3 collectives (deepspeed-2021), per forward
    bw_dp_s: float = 0.0  # ... per backward

    def parts(self, phase: str) -> tuple[float, float, float, float, float]:
        """(compute, tp, ep, cp, dp) seconds of one forward (``"F"``) or backward (``"B"``)."""
        if phase == "F":
            return self.fw_compute_s, self.fw_tp_s, self.fw_ep_s, self.fw_cp_s, self.fw_dp_s
        return self.bw_compute_s, self.bw_tp_s, self.bw_ep_s, self.bw_cp_s, self.bw_dp_s


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Everything `build_exec_graph` needs, as plain numbers."""

    chunks: tuple[tuple[ChunkCost, ...], ...]  # [stage][chunk]
    num_micro_batches: int
    schedule: str
    pp_hop_s: float
    optimizer_s: tuple[float, ...]  # per stage
    param_gather_s: tuple[float, ...]  # per stage, after the optimizer
    overlap_grad_reduce: bool = True
    buckets: int = 1
    blocking_sends: bool = False
    embedding_sync_s: float = 0.0  # tied embedding's all-reduce, first and last stage
    norm_sync_s: tuple[float, ...] = ()  # per stage: the SP norms' TP all-reduce (or none)

    @property
    def pp(self) -> int:
        """Pipeline stages."""
        return len(self.chunks)

    @property
    def v(self) -> int:
        """Model chunks per stage."""
        return len(self.chunks[0])

    def seconds(self, key: CostKey) -> float:
        """The price of one cost key (the module docstring lists them)."""
        kind = key[0]
        if kind == "task":
            _, s, chunk, phase, n = key
            return sum(self.chunks[s][chunk].parts(phase)) / n
        if kind == "grad_sync":
            _, s, chunk, n = key
            return self.chunks[s][chunk].grad_sync_s / n
        if kind == "zero3_gather":
            return self.chunks[key[1]][key[2]].zero3_gather_s
        if kind == "zero3_scatter":
            return self.chunks[key[1]][key[2]].zero3_scatter_s
        if kind == "optimizer":
            return self.optimizer_s[key[1]]
        if kind == "param_gather":
            return self.param_gather_s[key[1]]
        if kind == "norm_sync":
            return self.norm_sync_s[key[1]]
        if key == EMBEDDING_SYNC:
            return self.embedding_sync_s
        if key == PP_HOP:
            return self.pp_hop_s
        raise KeyError(key)
