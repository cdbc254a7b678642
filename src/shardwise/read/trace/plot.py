"""``trace --plot``: which sources a range of steps drew from, as a terminal chart or SVG.

Why: a loss spike that lines up with one source file (or one blend source) shows at a
glance. Each step's tokens are counted per *label* — the blend source's name, or the
source file — from the step's trace without source lines (chunk → file from the
manifest: no chunk metadata is read). No plotting library: a chart is text, or an SVG
file of rectangles::

    step   0 |#########################=============          | a.jsonl 62% b.jsonl 38%
    step   1 |##################==================            |
    legend  # a.jsonl  = b.jsonl
"""

from __future__ import annotations

import os
from collections import Counter
from html import escape
from typing import Any

MARKS = "#=+*o%@x~:"
COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
          "#ff9da7", "#9c755f", "#bab0ac")
MAX_ROWS = 60


def step_mix(tracer: Any, start: int, stop: int) -> list[Counter[str]]:
    """Tokens per label for each step of ``[start, stop)``."""
    out = []
    blend = tracer.config.blend is not None
    for s in range(start, stop):
        mix: Counter[str] = Counter()
        for e in tracer.step(s).examples:
            for p in e.pieces:
                label = e.source if blend else os.path.basename(p.where.source_path)
                mix[str(label)] += p.tokens
        out.append(mix)
    return out


def _rows(mix: list[Counter[str]], start: int) -> list[tuple[str, Counter[str]]]:
    """At most ``MAX_ROWS`` rows: consecutive steps summed into buckets when more."""
    per = max(1, -(-len(mix) // MAX_ROWS))
    rows = []
    for i in range(0, len(mix), per):
        total: Counter[str] = Counter()
        for m in mix[i: i + per]:
            total.update(m)
        a, b = start + i, start + min(i + per, len(mix)) - 1
        rows.append((f"step {a}" if a == b else f"steps {a}-{b}", total))
    return rows


def labels_of(mix: list[Counter[str]]) -> list[str]:
    """Every label, the most tokens first."""
    total: Counter[str] = Counter()
    for m in mix:
        total.update(m)
    return [k for k, _ in total.most_common()]


def terminal_chart(mix: list[Counter[str]], start: int, width: int = 50) -> str:
    """One stacked bar per step (or bucket of steps), shares in percent, a legend."""
    labels = labels_of(mix)
    mark = {k: MARKS[i % len(MARKS)] for i, k in enumerate(labels)}
    rows = _rows(mix, start)
    name_w = max(len(n) for n, _ in rows) if rows else 4
    lines = []
    for name, counts in rows:
        total = sum(counts.values()) or 1
        bar = "".join(mark[k] * round(width * counts[k] / total) for k in labels)
        shares = " ".join(f"{k} {100 * counts[k] / total:.0f}%" for k in labels if counts[k])
        lines.append(f"{name:>{name_w}} |{bar[:width]:<{width}}| {shares}")
    lines.append("legend  " + "  ".join(f"{mark[k]} {k}" for k in labels))
    return "\n".join(lines)


def svg_chart(mix: list[Counter[str]], start: int) -> str:
    """The same chart as an SVG document: one horizontal stacked bar per row."""
    labels = labels_of(mix)
    color = {k: COLORS[i % len(COLORS)] for i, k in enumerate(labels)}
    rows = _rows(mix, start)
    bar_w, row_h, left = 500, 14, 110
    height = row_h * (len(rows) + len(labels) + 2)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + bar_w + 20}" '
           f'height="{height}" font-family="monospace" font-size="11">']
    for r, (name, counts) in enumerate(rows):
        y, x, total = r * row_h + 4, float(left), sum(counts.values()) or 1
        out.append(f'<text x="4" y="{y + 10}">{escape(name)}</text>')
        for k in labels:
            w = bar_w * counts[k] / total
            if w > 0:
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 2}" '
                           f'fill="{color[k]}"><title>{escape(k)}: {counts[k]} tokens'
                           f'</title></rect>')
            x += w
    for i, k in enumerate(labels):
        y = (len(rows) + 1 + i) * row_h + 4
        out.append(f'<rect x="4" y="{y}" width="10" height="10" fill="{color[k]}"/>'
                   f'<text x="20" y="{y + 9}">{escape(k)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
