"""`run_sweep`: one pure chunk function mapped serially or over Ray (the only Ray importer).

``evaluate_chunk(tier, points, shared)`` turns layouts into rows: the ``screen`` tier prices
each with the closed form (`screen`), the ``simulate`` tier with `simulate`. It is a pure
function of its arguments, so the serial executor (a loop) and the Ray executor (the same
function as a remote task over chunks) give identical rows; rows are sorted by key.

Ray: unless ``address`` names a cluster, a local Ray is started with ``num_cpus=workers``,
no dashboard and usage stats off, and shut down afterwards. The `Shared` inputs (contexts and
their kernel tables, computed once in the driver) are sent once with ``ray.put`` and fetched
once per worker (`_ray_chunk`); rows come back as plain pickle bytes. A task whose
worker dies is retried by Ray (``max_retries``); if it still fails, it is halved and its
halves run once each, down to single layouts: only a layout that kills its worker becomes an
``error`` row, the rest of its chunk is priced as usual. An exception inside one layout
becomes that layout's ``error`` row (with the traceback) and the others go on; so does a
result of NaN or infinity (JSON has neither).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from simulator.errors import ConfigError
from simulator.rows import Row
from simulator.space import Point
from simulator.sweep_chunks import plain_chunks, simulate_chunks
from simulator.sweep_eval import Shared, Tier, evaluate_chunk, layout_row

Executor = Literal["serial", "ray"]
MAX_RETRIES = 3


def _failed_layout(tier: Tier, p: Point, shared: Shared, err: str) -> Row:
    row = layout_row(shared, p, tier)
    row.update(status="error", reason="its worker died evaluating it (Ray retried)", error=err)
    return row


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
        with _sigint_deferred() as interrupted:
            ray.init(address="local", num_cpus=opts.workers, **common)
        if interrupted:
            ray.shutdown()
            raise KeyboardInterrupt
    return True


@contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Hold off Ctrl-C while Ray starts: interrupted inside ``ray.init``, Ray has not yet noted
    what it started, so neither it nor ``ray.shutdown`` stops it, and its agents lingered a
    minute after tilesim had exited. The list yielded is non-empty when one came; a second
    Ctrl-C interrupts at once."""
    interrupted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if previous in (None, signal.SIG_IGN):  # only the main thread gets signals; None: not
        # a Python handler; SIG_IGN: Ctrl-C is ignored (a background job) and stays so
        yield interrupted
        return

    def note(signum: int, frame: object) -> None:
        interrupted.append(signum)
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


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


# a client's opening of an HTTP/2 connection and an empty SETTINGS frame (RFC 9113 3.4, 6.5)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``HOST:PORT`` (or ``ray://HOST[:PORT]``) where no Ray listens:
    ``ray.init`` retried a closed port for minutes, and a port where something else listens
    (a web server) for two minutes of warnings. A Ray head (its GCS) and a Ray client server
    speak gRPC, so HTTP/2: each answers a client's preface with a SETTINGS frame. Under TLS
    (``RAY_USE_TLS``) the probe is left to Ray; ``auto`` too."""
    client = address.startswith("ray://")
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if client and not sep:
        host, sep, port = address.removeprefix("ray://"), ":", "10001"
    if not sep or not port.isdigit() or "://" in address.removeprefix("ray://"):
        return
    what = "ray://HOST:PORT of a Ray client server" if client else "HOST:PORT of a Ray head"
    fix = f"give the {what} (`ray start --head` prints it) or leave out --address for a local Ray"
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as e:
        raise ConfigError(f"--address {address}: cannot connect ({e}); {fix}") from None
    head = b""
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        try:
            conn.sendall(H2_PREFACE)
            while len(head) < 9:  # a frame header: length (3), type (1), flags, stream id
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:  # reset, or silent past the timeout: judged on what came back
            pass
    if len(head) < 9 or head[3] != 4:  # type 4: SETTINGS
        raise ConfigError(
            f"--address {address}: something listens there but it is not Ray (no gRPC "
            f"answer within {timeout_s:g} s); {fix}"
        )


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
    once = remote.options(max_retries=0)
    boxed = [ray.put(shared)]
    pending = {remote.remote(tier, c, shared.token, boxed): c for c in chunks}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        chunk = pending.pop(ready[0])
        try:
            rows = pickle.loads(ray.get(ready[0]))
        except (ray.exceptions.RayError, OSError) as e:
            if len(chunk) == 1:
                rows = [_failed_layout(tier, chunk[0], shared, repr(e))]
            else:  # halve it until the layout that kills its worker is alone
                half = len(chunk) // 2
                for piece in (chunk[:half], chunk[half:]):
                    pending[once.remote(tier, piece, shared.token, boxed)] = piece
                continue
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
    chunks = simulate_chunks(points, size, shared) if by_shape else plain_chunks(points, size)
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
