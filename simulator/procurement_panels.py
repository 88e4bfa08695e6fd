"""The procurement figure's panels: which quantities it shows, in which unit, and their bars.

Per cluster option and size, its best layout's time to train (tokens/s without a token
budget), cost and energy, the panels the rows can fill (`procurement_panels`), each drawn as
labelled bars (`draw_panel`). `plots.plot_procurement` lays them out and titles the figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.axes import Axes

from simulator.figures import whole_numbers
from simulator.report import amount_text
from simulator.rows import Row

# (context, its best row or None, why none): `report.procurement_entries`
Entry = tuple[str, Row | None, tuple[str, str]]

# (unit, scale) choices per quantity, largest first: the first in which the largest value
# reads as at least 1 is used (a fine-tuning budget's cost read 0.00 million $)
_DAYS = (("days", 1 / 86400), ("hours", 1 / 3600), ("minutes", 1 / 60), ("s", 1.0))
_USD = (("million $", 1e-6), ("thousand $", 1e-3), ("$", 1.0))
_MWH = (("MWh", 1.0), ("kWh", 1e3), ("Wh", 1e6))


def _unit(values: list[float | None], units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    top = max((v for v in values if v is not None), default=0.0)
    return next(((u, k) for u, k in units if top * k >= 1), units[-1])


@dataclass(frozen=True, slots=True)
class Panel:
    """One panel of the procurement figure: a quantity per option and size."""

    what: str  # the axis label
    units: tuple[tuple[str, float], ...]  # unit choices (`_unit`)
    values: list[float | None]  # per entry, SI
    lacks: str  # what an entry with a best layout but no value lacks ("no price")
    color: str


def procurement_panels(entries: list[Entry]) -> list[Panel]:
    """Time to train (tokens/s without a token budget), then cost and energy where any best
    layout has them."""
    best = [r for _, r, _ in entries if r is not None]

    def column(col: str) -> list[float | None]:
        return [None if r is None else r[col] for _, r, _ in entries]

    panels: list[Panel] = []
    if any(r["time_to_train_s"] is not None for r in best):
        days = column("time_to_train_s")
        panels.append(Panel("time to train the token budget", _DAYS, days, "", "#4c72b0"))
    else:
        tps = column("tokens_per_s")
        panels.append(Panel("throughput", (("tokens/s", 1.0),), tps, "", "#4c72b0"))
    if any(r["cost_usd"] is not None for r in best):
        cost = column("cost_usd")
        panels.append(Panel("cost (user-supplied prices)", _USD, cost, "no price", "#c44e52"))
    if any(r["energy_mwh"] is not None for r in best):
        mwh = column("energy_mwh")
        panels.append(Panel("energy (user-supplied power)", _MWH, mwh, "no power", "#55a868"))
    return panels


def draw_panel(ax: Axes, panel: Panel, entries: list[Entry]) -> None:
    """One panel's bars, top to bottom in the report table's order, each labelled with its
    amount, or why it has none."""
    unit, scale = _unit(panel.values, panel.units)
    values = [None if v is None else v * scale for v in panel.values]
    bars = ax.barh([ctx for ctx, _, _ in entries], [v or 0.0 for v in values], color=panel.color)
    ax.invert_yaxis()  # top to bottom in the report table's order, best first
    texts = [
        (why if r is None else panel.lacks) if v is None else amount_text(v)
        for (_, r, (why, _)), v in zip(entries, values, strict=True)
    ]
    ax.bar_label(bars, labels=texts, fontsize=8, padding=2)
    ax.set_xlabel(f"{panel.what}, {unit}")
    if unit == "tokens/s":
        whole_numbers(ax.xaxis)
    ax.set_xlim(0, max((v for v in values if v is not None), default=0.0) * 1.2 or 1.0)
