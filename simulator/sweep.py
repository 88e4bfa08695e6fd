"""`run_sweep`: one pure chunk function mapped serially or over Ray (the only Ray importer).

``evaluate_chunk(tier, points, shared)`` turns layouts into rows: the ``screen`` tier prices
each with the closed form (`screen`), the ``simulate`` tier with `simulate`. It is a pure
function of its arguments, so the serial executor (a loop) and the Ray executor (the same
function as a remote task over chunks) give identical rows; rows are sorted by key.

Ray: unless ``address`` names a cluster, a local Ray is started with ``num_cpus=workers``,
no dashboard and usage stats off, and shut down afterwards. The `Shared` inputs (contexts and
their kernel tables, computed once in the driver) are sent once with ``ray.put`` and fetched
once per worker (`_ray_chunk`); rows come back as plain pickle bytes. A task whose
worker dies is retried by Ray (``max_retries``); if it still fails, its layouts become
``error`` rows. An exception inside one layout becomes that layout's ``error`` row (with the
traceback) and the others go on; so does a result of NaN or infinity (JSON has neither).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from forecast.predict import LatencyTable
from simulator.errors import ConfigError, InfeasibleConfig
from simulator.parallel import RunConfig
from simulator.rows import Row, add_training_cost, blank_row, finite_problem
from simulator.screen import ScreenCache, screen
from simulator.simulate import latency_table, simulate
from simulator.space import Context, Point, Space

Tier = Literal["screen", "simulate"]
Executor = Literal["serial", "ray"]
MAX_RETRIES = 3


@dataclass(frozen=True)
class Shared:
    """What every chunk needs: contexts, one kernel table per context, the base run."""

    contexts: tuple[Context, ...]
    tables: tuple[LatencyTable, ...]
    base_run: RunConfig
    train_tokens: float | None
    # This sweep's identity in a worker's screen caches (`screen_cache`); not part of any row.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


def build_shared(space: Space, base_run: RunConfig) -> Shared:
    """Forecast each GPU's kernels once (one representative run per shard shape)."""
    by_gpu: dict[str, dict[tuple[Any, ...], RunConfig]] = {}
    for p in space.points:
        run = p.run(base_run)
        key = (run.tp, run.cp, run.ep, run.micro_batch_size, run.sequence_parallel)
        by_gpu.setdefault(space.contexts[p.context].inputs.gpu.name, {})[key] = run
    tables: dict[str, LatencyTable] = {}
    for ctx in space.contexts:
        name = ctx.inputs.gpu.name
        if name not in tables:
            tables[name] = latency_table(ctx.inputs, list(by_gpu.get(name, {}).values()))
    return Shared(
        contexts=space.contexts,
        tables=tuple(tables[c.inputs.gpu.name] for c in space.contexts),
        base_run=base_run,
        train_tokens=space.train_tokens,
    )


TOP_CANDIDATES = 48  # `tilesim sweep --candidates`
PER_CONTEXT = 2  # `tilesim sweep --per-context`


def candidate_points(
    points: Sequence[Point],
    rows: Sequence[Row],
    shared: Shared,
    *,
    top: int = TOP_CANDIDATES,
    per_context: int = PER_CONTEXT,
) -> list[Point]:
    """The layouts among ``points`` that `select_candidates` picks from the screened ``rows``."""
    keys = set(select_candidates(rows, top=top, per_context=per_context))
    return [p for p in points if p.key(shared.contexts[p.context].id) in keys]


def select_candidates(rows: Sequence[Row], *, top: int, per_context: int) -> list[str]:
    """Keys to simulate: the ``top`` fitting layouts by screen tokens/s, plus the best
    ``per_context`` of every context (so scaling and procurement have a simulated best)."""
    ok = [r for r in rows if r["status"] == "ok"]
    ok.sort(key=lambda r: (-r["screen_tokens_per_s"], r["key"]))
    keys = [r["key"] for r in ok[:top]]
    seen: dict[str, int] = {}
    for r in ok:
        if seen.get(r["context"], 0) < per_context:
            seen[r["context"]] = seen.get(r["context"], 0) + 1
            keys.append(r["key"])
    return sorted(set(keys))


def layout_row(shared: Shared, p: Point, tier: Tier) -> Row:
    """The layout columns of a row (no results yet)."""
    ctx = shared.contexts[p.context]
    inputs = ctx.inputs
    layout = {k: getattr(p, k) for k in p.__slots__ if k != "context"}
    return blank_row(
        key=p.key(ctx.id),
        option=ctx.option,
        context=ctx.id,
        gpu=inputs.gpu.name,
        server=ctx.server,
        network=ctx.network,
        num_gpus=inputs.num_gpus,
        tier=tier,
        price_per_gpu_hour=ctx.price_per_gpu_hour,
        power_w_per_gpu=ctx.power_w_per_gpu,
        train_tokens=shared.train_tokens,
        **layout,
    )


def _screen_row(row: Row, cache: ScreenCache, run: RunConfig) -> None:
    est = screen(cache, run)
    mem = est.memory
    row.update(
        screen_iteration_s=est.iteration_s,
        screen_tokens_per_s=est.tokens_per_s,
        memory_gib_per_gpu=mem.total_bytes / 2**30,
        fits=mem.fits,
        status="ok" if mem.fits else "infeasible",
        reason=mem.reason,
    )


def _simulate_row(row: Row, shared: Shared, p: Point, run: RunConfig) -> None:
    res = simulate(shared.contexts[p.context].inputs, run, shared.tables[p.context]).to_row()
    exposed = res.pop("exposed_comm_s")
    res.pop("dp")
    row.update({k: v for k, v in res.items() if k in row})
    row.update({f"exposed_{k}_s": v for k, v in exposed.items()})
    row["status"] = "ok" if res["fits"] else "infeasible"
    add_training_cost(row)


_SCREEN_CACHES: OrderedDict[tuple[str, int], ScreenCache] = OrderedDict()
SCREEN_CACHE_SLOTS = 32  # contexts whose screen caches one process keeps (least recent dropped)


def screen_cache(shared: Shared, context: int) -> ScreenCache:
    """This process's screen cache of one context of one sweep, kept across chunks: a Ray
    worker prices each block and collective once per sweep, not once per chunk (the rebuilds
    were about 40% of a 500-layout chunk). The values are the same either way."""
    key = (shared.token, context)
    cache = _SCREEN_CACHES.get(key)
    if cache is None:
        ctx = shared.contexts[context]
        cache = _SCREEN_CACHES[key] = ScreenCache(ctx.inputs, shared.tables[context])
        if len(_SCREEN_CACHES) > SCREEN_CACHE_SLOTS:
            _SCREEN_CACHES.popitem(last=False)
    else:
        _SCREEN_CACHES.move_to_end(key)
    return cache


def evaluate_chunk(tier: Tier, points: Sequence[Point], shared: Shared) -> list[Row]:
    """Rows for a chunk of layouts; unexpected errors are recorded per layout."""
    rows = []
    for p in points:
        row = layout_row(shared, p, tier)
        try:
            run = p.run(shared.base_run)
            if tier == "screen":
                _screen_row(row, screen_cache(shared, p.context), run)
            else:
                _simulate_row(row, shared, p, run)
        except InfeasibleConfig as e:
            row.update(status="infeasible", reason=e.reason)
        except Exception as e:
            row.update(status="error", reason=f"{type(e).__name__}: {e}")
            row["error"] = traceback.format_exc()
        bad = finite_problem(row)
        if bad is not None:  # JSON has no NaN: this layout fails, the others go on
            row = layout_row(shared, p, tier)
            row.update(status="error", reason=f"non-finite result: {bad}")
        rows.append(row)
    return rows


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


def _chunks(points: Sequence[Point], size: int) -> list[Sequence[Point]]:
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
    pieces = [c for g in groups.values() for c in _chunks(g, size)]
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


def _failed_chunk(tier: Tier, chunk: Sequence[Point], shared: Shared, err: str) -> list[Row]:
    rows = []
    for p in chunk:
        row = layout_row(shared, p, tier)
        row.update(status="error", reason=f"worker failed {MAX_RETRIES + 1} times", error=err)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide to run: ``address`` None starts a local Ray of ``workers`` CPUs."""

    workers: int = 2
    address: str | None = None


def _ray_init(opts: RayOptions) -> bool:
    """Start or join Ray; True when this call started it (so it also shuts it down)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts workers at niceness 15; the sweep is the main job, so give them normal
    # priority (on a busy 2-core machine niced workers ran at half the serial rate).
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    if ray.is_initialized():
        return False
    common: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
    }
    if opts.address:
        check_address(opts.address)
        _check_reachable(opts.address)
        try:
            ray.init(address=opts.address, **common)
        except ConnectionError as e:
            raise ConfigError(
                f"--address {opts.address}: no Ray cluster to join ({e}); start one with "
                "`ray start --head`; for a head with token authentication set "
                "RAY_AUTH_MODE=token (Ray sends its token to an address given by hand only "
                "then) or use --address auto on the head's machine; or leave out --address "
                "for a local Ray"
            ) from None
    else:
        # "local": always a new embedded Ray; without it ray.init joins any cluster this
        # machine has started (`ray start`), and refuses num_cpus there.
        ray.init(address="local", num_cpus=opts.workers, **common)
    return True


ADDRESS_FORMS = "HOST:PORT (a Ray head), auto (the cluster on this machine) or ray://HOST[:PORT]"


def check_address(address: str) -> None:
    """Refuse, before any work, an ``--address`` that is none of `ADDRESS_FORMS` (Ray raised
    a ValueError traceback for ``nonsense`` or ``localhost:abc``)."""
    if address == "auto":
        return
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if client and not sep:  # a Ray client address may leave out its port
        host, sep, port = rest, ":", "10001"
    number = port.isascii() and port.isdigit() and 0 < int(port) < 65536
    if not (sep and host and number) or any(c.isspace() or c in "/@" for c in rest):
        raise ConfigError(
            f"--address {address!r}: give {ADDRESS_FORMS}, or leave it out for a local Ray"
        )


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``HOST:PORT`` where nothing listens: ``ray.init`` would retry it for
    minutes. ``auto`` and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            f"--address {address}: cannot connect ({e}); give the HOST:PORT of a running Ray "
            "head (`ray start --head` prints it) or leave out --address for a local Ray"
        ) from None


_WORKER_SHARED: dict[str, Shared] = {}


def _ray_chunk(tier: Tier, points: Sequence[Point], token: str, boxed: list[Any]) -> bytes:
    """The Ray task: `evaluate_chunk`, with this sweep's `Shared` fetched once per worker (its
    ref travels in a list, so Ray does not resolve and deserialise it for every task), and the
    rows returned as plain pickle bytes (Ray's cloudpickle took 3x longer on 500 row dicts:
    about 12 ms a screen chunk, a third of its work)."""
    shared = _WORKER_SHARED.get(token)
    if shared is None:
        import ray

        _WORKER_SHARED.clear()  # one sweep at a time per worker
        shared = _WORKER_SHARED[token] = ray.get(boxed[0])
    return pickle.dumps(evaluate_chunk(tier, points, shared), protocol=pickle.HIGHEST_PROTOCOL)


def _run_ray(
    tier: Tier, chunks: list[Sequence[Point]], shared: Shared, on_rows: Callable[[list[Row]], None]
) -> None:
    import ray

    remote = ray.remote(max_retries=MAX_RETRIES)(_ray_chunk)
    boxed = [ray.put(shared)]
    pending = {remote.remote(tier, c, shared.token, boxed): c for c in chunks}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        chunk = pending.pop(ready[0])
        try:
            rows = pickle.loads(ray.get(ready[0]))
        except (ray.exceptions.RayError, OSError) as e:
            rows = _failed_chunk(tier, chunk, shared, repr(e))
        on_rows(rows)


@contextmanager
def ray_session(executor: Executor, opts: RayOptions) -> Iterator[None]:
    """Keep one Ray runtime up for several `run_sweep` calls (no-op for ``serial``)."""
    started = executor == "ray" and _ray_init(opts)
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()


def run_sweep(
    tier: Tier,
    points: Sequence[Point],
    shared: Shared,
    *,
    executor: Executor = "serial",
    chunk_size: int = 200,
    on_rows: Callable[[list[Row]], None] | None = None,
    ray_options: RayOptions | None = None,
) -> list[Row]:
    """Evaluate every layout; ``on_rows`` sees each chunk as it arrives; result sorted by key."""
    out: list[Row] = []

    def collect(rows: list[Row]) -> None:
        out.extend(rows)
        if on_rows is not None:
            on_rows(rows)

    size = max(1, chunk_size)
    # Rows are sorted by key at the end, whatever the chunk order.
    by_shape = tier == "simulate"
    chunks = simulate_chunks(points, size, shared) if by_shape else _chunks(points, size)
    if executor == "serial":
        for c in chunks:
            collect(evaluate_chunk(tier, c, shared))
    elif chunks:
        started = _ray_init(ray_options or RayOptions())
        try:
            _run_ray(tier, chunks, shared, collect)
        finally:
            if started:
                import ray

                ray.shutdown()
    return sorted(out, key=lambda r: r["key"])
