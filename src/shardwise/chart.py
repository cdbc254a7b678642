"""Stacked-bar charts as text or SVG, with no plotting library: the one renderer behind
``trace --plot`` (which sources a range of steps drew from) and ``inspect --plot`` (a
blend schedule's planned mix).

A chart is rows ``(label, {name: amount})``; each row is one bar whose parts are the
names' shares of the row's total, in a fixed order (most in all first, unless given)::

    steps 0-99     |###################################===============| web 70% code 30%
    steps 100-199  |####################==============================| web 40% code 30% math 30%
    legend  # web  = code  + math
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

MARKS = "#=+*o%@x~:"
COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
          "#ff9da7", "#9c755f", "#bab0ac")
Row = tuple[str, Mapping[str, float]]


def names_of(rows: Sequence[Row]) -> list[str]:
    """Every name, the largest total first (ties: first seen)."""
    total: dict[str, float] = {}
    for _, amounts in rows:
        for k, v in amounts.items():
            total[k] = total.get(k, 0.0) + v
    return sorted(total, key=lambda k: -total[k])


def _bar(amounts: Mapping[str, float], names: Sequence[str], width: int,
         mark: Mapping[str, str]) -> str:
    """``width`` cells split by largest remainders, so the parts always fill the bar."""
    total = sum(amounts.get(k, 0) for k in names)
    if total <= 0:
        return ""
    exact = [width * amounts.get(k, 0) / total for k in names]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(names)), key=lambda i: cells[i] - exact[i])[: width - sum(cells)]:
        cells[i] += 1
    return "".join(mark[k] * c for k, c in zip(names, cells, strict=True))


def terminal_chart(rows: Sequence[Row], *, width: int = 50,
                   names: Sequence[str] | None = None) -> str:
    """One stacked bar per row, each name's share in percent, and a legend."""
    order = list(names) if names is not None else names_of(rows)
    mark = {k: MARKS[i % len(MARKS)] for i, k in enumerate(order)}
    label_w = max((len(r) for r, _ in rows), default=4)
    lines = []
    for label, amounts in rows:
        total = sum(amounts.get(k, 0) for k in order) or 1
        shares = " ".join(f"{k} {100 * amounts[k] / total:.0f}%" for k in order
                          if amounts.get(k, 0))
        lines.append(f"{label:>{label_w}} |{_bar(amounts, order, width, mark):<{width}}| "
                     f"{shares}")
    lines.append("legend  " + "  ".join(f"{mark[k]} {k}" for k in order))
    return "\n".join(lines)


def svg_chart(rows: Sequence[Row], *, unit: str = "", names: Sequence[str] | None = None,
              title: str = "") -> str:
    """The same chart as an SVG document: one horizontal stacked bar per row; hovering a
    part shows its name and amount (``unit`` after it)."""
    order = list(names) if names is not None else names_of(rows)
    color = {k: COLORS[i % len(COLORS)] for i, k in enumerate(order)}
    bar_w, row_h = 500, 14
    left = 8 + 7 * max((len(r) for r, _ in rows), default=4)
    top = row_h + 4 if title else 4
    height = top + row_h * (len(rows) + len(order) + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + bar_w + 20}" '
           f'height="{height}" font-family="monospace" font-size="11">']
    if title:
        out.append(f'<text x="4" y="12">{escape(title)}</text>')
    for r, (label, amounts) in enumerate(rows):
        y, x = top + r * row_h, float(left)
        total = sum(amounts.get(k, 0) for k in order) or 1
        out.append(f'<text x="4" y="{y + 10}">{escape(label)}</text>')
        for k in order:
            w = bar_w * amounts.get(k, 0) / total
            if w > 0:
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 2}" '
                           f'fill="{color[k]}"><title>{escape(k)}: {amounts[k]:g}'
                           f'{" " + escape(unit) if unit else ""}</title></rect>')
            x += w
    for i, k in enumerate(order):
        y = top + (len(rows) + 1 + i) * row_h - row_h // 2
        out.append(f'<rect x="4" y="{y}" width="10" height="10" fill="{color[k]}"/>'
                   f'<text x="20" y="{y + 9}">{escape(k)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
