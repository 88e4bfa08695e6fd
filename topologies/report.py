"""Text formatting of catalogs, estimates and the measured-vs-predicted table (GB/s, us)."""

from __future__ import annotations

from collections.abc import Sequence

from topologies.catalog import list_networks, list_servers
from topologies.collectives import CollectiveEstimate
from topologies.measured import Comparison
from topologies.spec import TopologyError


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
    """One human line for an estimate."""
    return (
        f"{est.op} {est.nbytes:g} B over {est.num_ranks} ranks: {est.time_s * 1e6:.1f} us, "
        f"algbw {est.algbw_bytes_per_s / 1e9:.1f} GB/s, busbw {est.busbw_bytes_per_s / 1e9:.1f} "
        f"GB/s ({est.algorithm}/{est.protocol})"
    )


def check_table(rows: Sequence[Comparison]) -> str:
    """Markdown table of measured vs predicted all-reduce busbw; a `TopologyError` for no rows
    (a ``--min-bytes`` of NaN, inf or above every measured size leaves none)."""
    if not rows:
        raise TopologyError(
            "no measured point is at least --min-bytes; give a finite --min-bytes "
            "no larger than the largest measured size"
        )
    out = [
        "| cluster | GPUs | bytes | measured GB/s | predicted GB/s | error | algorithm |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        meas, pred = r.measured_busbw_bytes_per_s / 1e9, r.predicted_busbw_bytes_per_s / 1e9
        out.append(
            f"| {r.server} | {r.gpus} | {r.nbytes:.4g} | {meas:.1f} | {pred:.1f} "
            f"| {r.error:+.1%} | {r.algorithm} |"
        )
    return "\n".join(out)
