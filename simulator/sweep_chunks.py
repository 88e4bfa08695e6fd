"""How a tier's layouts are cut into tasks: screens in fixed chunks, simulations in chunks
of whole graph-shape groups (`simulate_chunks`), so a process builds each graph shape once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.space import Point
from simulator.sweep_eval import Shared, Tier

SCREEN_CHUNK = 500


def chunk_size(tier: Tier, layouts: int, workers: int) -> int:
    """Layouts per task: screens are cheap (hundreds per task); simulations are spread as
    about four tasks per worker, at most eight layouts each."""
    if tier == "screen":
        return SCREEN_CHUNK
    return max(1, min(8, layouts // (4 * workers)))


def _shape_key(p: Point) -> tuple[int, str, int, int, int, int, bool, bool]:
    """What a layout's execution-graph shape depends on (micro-batches follow from dp and the
    micro-batch size in one context; a sharded optimizer adds the parameter all-gather)."""
    return (
        p.context,
        p.schedule,
        p.pp,
        p.virtual_stages,
        p.dp,
        p.micro_batch_size,
        p.zero_stage == 3,
        p.zero_stage >= 1 or p.distributed_optimizer,
    )


def plain_chunks(points: Sequence[Point], size: int) -> list[Sequence[Point]]:
    return [points[i : i + size] for i in range(0, len(points), size)]


def _graph_tasks(p: Point, shared: Shared) -> int:
    """Compute tasks in a layout's execution graph (forward and backward per stage, chunk and
    micro-batch): what building its graph costs, the bulk of a first simulation of a shape."""
    batch = shared.contexts[p.context].inputs.global_batch_size
    return 2 * p.pp * p.virtual_stages * max(1, batch // (p.dp * p.micro_batch_size))


REBUILD_SHARE = 0.1  # a further layout of an already built graph shape, as a share of the build


def _piece_cost(piece: Sequence[Point], shared: Shared) -> float:
    """Relative cost of simulating a piece of one graph shape in one process: one graph build
    (`_graph_tasks`), and each further layout about a tenth of it (measured on the GPT-3 sweep:
    0.3 s to build an 18k-task graph, 0.02-0.03 s for each further layout of it)."""
    return _graph_tasks(piece[0], shared) * (1 + REBUILD_SHARE * (len(piece) - 1))


def simulate_chunks(points: Sequence[Point], size: int, shared: Shared) -> list[Sequence[Point]]:
    """Chunks of at most ``size`` layouts made of whole graph-shape groups, heaviest first.

    A shape's layouts stay together (split only when more than ``size``): a worker builds each
    of its shapes' graphs once (`execgraph.exec_graph` caches it per process), and no shape is
    built by two workers unless it has more than ``size`` layouts. Small groups share a chunk
    while it stays under the average chunk's cost (`_piece_cost`), so there are few tasks to
    dispatch but two heavy graphs never queue behind each other in one task. Heaviest first:
    Ray hands the next chunk to whichever worker is free, so big graphs start early and small
    ones fill the gaps (longest processing time first); pieces of a shape stay adjacent (a
    stable sort), so a serial run builds each once."""
    groups: dict[tuple[Any, ...], list[Point]] = {}
    for p in sorted(points, key=_shape_key):
        groups.setdefault(_shape_key(p), []).append(p)
    pieces = [c for g in groups.values() for c in plain_chunks(g, size)]
    pieces.sort(key=lambda c: _graph_tasks(c[0], shared), reverse=True)
    costs = [_piece_cost(c, shared) for c in pieces]
    budget = sum(costs) * size / max(1, len(points))  # the cost of an average full chunk
    chunks: list[list[Point]] = []
    chunk_cost = 0.0
    for piece, cost in zip(pieces, costs, strict=True):  # packed in order
        if chunks and len(chunks[-1]) + len(piece) <= size and chunk_cost + cost <= budget:
            chunks[-1].extend(piece)
            chunk_cost += cost
        else:
            chunks.append(list(piece))
            chunk_cost = cost
    return list(chunks)
