"""Text formatting of catalogs, estimates and the measured-vs-predicted table (GB/s, us; sizes
in binary units, KiB = 2^10 bytes, as the rest of the CLI prints GiB)."""

from __future__ import annotations

from collections.abc import Sequence

from topologies.catalog import list_networks, list_servers
from topologies.collectives import CollectiveEstimate
from topologies.measured import Comparison
from topologies.spec import TopologyError

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(nbytes: float) -> str:
    """A size in the largest binary unit it reaches: whole numbers from 100 up, else three
    significant digits (1,048,576 -> "1 MiB", 34,603,008 -> "33 MiB", 1.5 x 2^30 -> "1.5 GiB";
    the table printed "1.049e+06")."""
    value, unit = float(nbytes), BINARY_UNITS[0]
    for unit in BINARY_UNITS:
        if abs(value) < 1024 or unit == BINARY_UNITS[-1]:
            break
        value /= 1024
    return f"{format(value, ',.0f' if abs(value) >= 100 else '.3g')} {unit}"


def server_lines() -> list[str]:
    """One line per server: id, GPUs, fabric, per-direction GPU bandwidth, NICs."""
    lines = []
    for s in list_servers():
        fabric = s.fabric + (" +nvls" if s.nvls else "")
        bw = s.intra.bw_bytes_per_s_per_dir / 1e9
        lines.append(
            f"{s.id:20} {s.gpus_per_node:3} x {s.gpu:16} {fabric:15} {bw:5.0f} GB/s/dir  "
            f"{s.nics_per_node} NICs {s.default_network}"
        )
    return lines


def network_lines() -> list[str]:
    """One line per network: id, kind, per-direction port bandwidth, name."""
    return [
        f"{n.id:12} {n.kind:10} {n.link.bw_bytes_per_s_per_dir / 1e9:5.1f} GB/s/dir  {n.name}"
        for n in list_networks()
    ]


def describe(est: CollectiveEstimate) -> str:
    """One human line for an estimate; the size in a binary unit, and in bytes as given when
    that unit rounds it."""
    size = size_text(est.nbytes)
    if est.nbytes >= 1024:
        size += f" ({est.nbytes:,.0f} B)"
    us = est.time_s * 1e6
    took = f"{us:.1f} us" if us < 1e3 else f"{us / 1e3:.3f} ms"
    if us >= 1e6:  # "8,210,588.959 ms" read badly
        took = f"{us / 1e6:,.0f} s" if us >= 1e9 else f"{us / 1e6:.4g} s"
    return (
        f"{est.op} {size} over {est.num_ranks} ranks: {took}, "
        f"algbw {_gb_per_s(est.algbw_bytes_per_s)}, busbw {_gb_per_s(est.busbw_bytes_per_s)} "
        f"({est.algorithm}/{est.protocol})"
    )


def _gb_per_s(rate_bytes_per_s: float) -> str:
    """GB/s to one decimal, three significant digits below 10 (a 100-byte all-reduce moves
    0.00424 GB/s, which one decimal printed as 0.0)."""
    gb = rate_bytes_per_s / 1e9
    return f"{gb:,.1f} GB/s" if gb >= 10 else f"{gb:.3g} GB/s"


def check_table(rows: Sequence[Comparison]) -> str:
    """Markdown table of measured vs predicted all-reduce busbw; a `TopologyError` for no rows
    (a ``--min-bytes`` of NaN, inf or above every measured size leaves none)."""
    if not rows:
        raise TopologyError(
            "no measured point is at least --min-bytes; give a finite --min-bytes "
            "no larger than the largest measured size"
        )
    out = [
        "| cluster | GPUs | size | measured GB/s | predicted GB/s | error | algorithm |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        meas, pred = r.measured_busbw_bytes_per_s / 1e9, r.predicted_busbw_bytes_per_s / 1e9
        out.append(
            f"| {r.server} | {r.gpus} | {size_text(r.nbytes)} | {meas:.1f} | {pred:.1f} "
            f"| {r.error:+.1%} | {r.algorithm} |"
        )
    return "\n".join(out)
