"""Pipeline schedules: the order in which each stage runs its forward and backward tasks.

A schedule maps (pp, micro-batches m, virtual stages v) to one list per stage of `Slot`s
(phase, micro-batch, model chunk). Dependencies across stages are not the schedule's business
(`execgraph` adds them); the order within a stage is. Closed forms with equal task times and
free communication: GPipe and 1F1B idle ``(p-1)/(m+p-1)`` of the step; interleaved 1F1B with
``v`` chunks idles ``(p-1)/(v*m+p-1)`` (Narayanan et al. 2021, section 2.2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Phase = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One task of a stage: forward or backward of one micro-batch through one chunk."""

    phase: Phase
    micro: int
    chunk: int


def gpipe(pp: int, m: int, v: int) -> list[list[Slot]]:
    """All forwards, then all backwards (chunks in model order forward, reverse backward)."""
    fw = [Slot("F", i, c) for c in range(v) for i in range(m)]
    bw = [Slot("B", i, c) for c in reversed(range(v)) for i in range(m)]
    return [fw + bw for _ in range(pp)]


def one_f_one_b(pp: int, m: int, v: int) -> list[list[Slot]]:
    """PipeDream-Flush 1F1B: ``pp - s - 1`` warm-up forwards, then alternate, then drain."""
    if v != 1:
        return interleaved(pp, m, v)
    out = []
    for s in range(pp):
        warm = min(pp - s - 1, m)
        order = [Slot("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            order += [Slot("F", warm + i, 0), Slot("B", i, 0)]
        order += [Slot("B", i, 0) for i in range(m - warm, m)]
        out.append(order)
    return out


def _interleaved_slot(k: int, pp: int, v: int, phase: Phase) -> Slot:
    in_group = k % (pp * v)
    chunk = in_group // pp
    if phase == "B":
        chunk = v - 1 - chunk
    return Slot(phase, (k // (pp * v)) * pp + k % pp, chunk)


def interleaved(pp: int, m: int, v: int) -> list[list[Slot]]:
    """Megatron's interleaved 1F1B (needs ``m % pp == 0``); ``v = 1`` is plain 1F1B."""
    if v == 1:
        return one_f_one_b(pp, m, 1)
    total = m * v
    out = []
    for s in range(pp):
        warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
        order = [_interleaved_slot(k, pp, v, "F") for k in range(warm)]
        for i in range(total - warm):
            order.append(_interleaved_slot(warm + i, pp, v, "F"))
            order.append(_interleaved_slot(i, pp, v, "B"))
        order += [_interleaved_slot(k, pp, v, "B") for k in range(total - warm, total)]
        out.append(order)
    return out


SCHEDULES: dict[str, Callable[[int, int, int], list[list[Slot]]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "1f1b-interleaved": interleaved,
}


@functools.lru_cache(maxsize=512)
def stage_orders(name: str, pp: int, m: int, v: int) -> tuple[tuple[Slot, ...], ...]:
    """Each stage's task order under schedule ``name``, cached: a sweep asks for the same
    (schedule, pp, m, v) for many layouts, and the execution graph and the memory model both
    need it."""
    return tuple(tuple(order) for order in SCHEDULES[name](pp, m, v))


def in_flight(order: Sequence[Slot]) -> int:
    """Most (micro-batch, chunk) activations a stage holds at once under this order."""
    live = peak = 0
    for slot in order:
        live += 1 if slot.phase == "F" else -1
        peak = max(peak, live)
    return peak
