"""Closed forms of a pipeline schedule for the screen (`screen`): micro-batches in flight, the
forward-backward span of stages of given forward and backward times, and the point-to-point
sends on its critical path. Each equals what the execution graph (`execgraph`, `scheduler`)
gives for equal stages (tests/simulator/test_schedule_audit_s11.py, test_screen_sends_s12.py).
"""

from __future__ import annotations


def in_flight_closed(schedule: str, pp: int, m: int, v: int, stage: int) -> int:
    """Micro-batch activations a stage holds at once (equals `schedules.in_flight`)."""
    if schedule == "gpipe":
        return m * v
    total = m * v
    later = pp - stage - 1
    warm = min(later, m) if v == 1 else min(later * 2 + (v - 1) * pp, total)
    return warm + 1 if total > warm else total


def pipeline_hops(schedule: str, pp: int, m: int, v: int) -> float:
    """One-way sends on the critical path of a pipeline of equal stages (fitted to nothing: the
    execution graph gives these exactly, `tests/simulator/test_schedule_audit_s11.py`). GPipe
    and interleaved 1F1B: the fill and the drain cross every boundary once, ``pp*v - 1`` each.
    1F1B: stage 0 holds ``pp`` micro-batches, so micro-batch ``i + pp`` waits on ``i``'s round
    trip, ``pp - 1`` sends each way; with ``m = q pp + r`` (``1 <= r <= pp``) the path takes
    ``q + 1`` round trips and turns back in the last ``r - 2`` stages above the first:
    ``(pp-1)(q+1) + max(0, r-2)`` (``(pp-1)m/pp + pp - 2`` where ``pp`` divides ``m``). These
    paths hold all ``m + pp - 1`` forwards and backwards, so GPipe and 1F1B stay exact for
    sends of any length; interleaving's longer sends add `send_paced_s`."""
    if pp == 1:
        return 0.0
    if schedule == "gpipe" or v > 1:
        return float(pp * v - 1)
    q, r = divmod(m - 1, pp)
    return float((pp - 1) * (q + 1) + max(0, r - 1))


def send_paced_s(pp: int, m: int, v: int, chunk: tuple[float, float], hop_s: float) -> float:
    """What interleaved 1F1B loses to sends ``h`` longer than a chunk's compute (``chunk``: the
    pacing stage's forward ``f`` and backward ``b`` of one micro-batch through one chunk).

    Two cycles outrun the steady state's ``f + b`` per forward-backward pair. The ring: chunk
    ``c + 1`` on stage 0 waits on chunk ``c`` on stage ``pp - 1`` (backwards the other way), so
    past ``h = min(f, b)`` each ring-linked pair takes ``max(f, b) + h``; those are ``v - 1`` of
    the ``v`` chunks of every micro-batch after the first ``pp``. Neighbours: past
    ``2h = f + b`` the path turns back and forth across stage boundaries, an up and down pair
    of sends for a forward and a backward, ``floor(g (pp-1) / 2)`` turns over ``g = m / pp``
    groups (``floor(pp/2) - 1`` for one). These are the path's counts on the execution graph:
    exact for ``m <= 4 pp``, any ``b / f`` and send; beyond, a lower bound within 6% for sends
    up to 4 chunk forwards (`tests/simulator/test_screen_sends_s12.py`)."""
    f, b = chunk
    g = m // pp
    turns = pp // 2 - 1 if g == 1 else g * (pp - 1) // 2
    ring = (m - pp) * (v - 1) * max(0.0, hop_s - min(f, b))
    return ring + 2 * turns * max(0.0, hop_s - (f + b) / 2)


def pipeline_sends_s(
    schedule: str, parts: list[tuple[float, float]], m: int, v: int, hop_s: float
) -> float:
    """Seconds the sends add to `forward_backward_s`'s span (``parts``: each stage's forward
    and backward of one micro-batch): ``2 * pipeline_hops * hop_s``, and where interleaving's
    sends outlast the pacing stage's chunk, `send_paced_s`."""
    pp = len(parts)
    sends = 2 * pipeline_hops(schedule, pp, m, v) * hop_s
    if pp == 1 or schedule == "gpipe" or v == 1:
        return sends
    f, b = max(parts, key=lambda p: p[0] + p[1])
    return sends + send_paced_s(pp, m, v, (f / v, b / v), hop_s)


def forward_backward_s(schedule: str, parts: list[tuple[float, float]], m: int, v: int) -> float:
    """Forward-backward span without sends, from each stage's forward and backward of one
    micro-batch (``parts``). GPipe runs every forward, then every backward, each phase a flow
    shop of ``m`` equal jobs (the sum of the stages' times plus ``m - 1`` of the slowest
    stage's); 1F1B alternates, so its slowest stage's forward plus backward sets the pace,
    ``T * (m + (pp - 1) / v)``."""
    pp = len(parts)
    if schedule == "gpipe":
        fw, bw = [f for f, _ in parts], [b for _, b in parts]
        return sum(fw) + sum(bw) + (m - 1) * (max(fw) + max(bw))
    return max(f + b for f, b in parts) * (m + (pp - 1) / v)
