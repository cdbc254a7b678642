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
from typing import Any

import shardwise.chart as chart

MAX_ROWS = 60


def step_mix(tracer: Any, start: int, stop: int) -> list[Counter[str]]:
    """Tokens per label for each step of ``[start, stop)``; a skipped example counts
    ``seq_len`` tokens under ``(skipped)``, so a skipped step is not drawn empty."""
    out = []
    blend = tracer.config.blend is not None
    for s in range(start, stop):
        mix: Counter[str] = Counter()
        for e in tracer.step(s).examples:
            if e.status != "data":  # skipped (or not yet built): drawn as what it is
                mix[f"({e.status})"] += int(tracer.config.seq_len or 1)
            for p in e.pieces:
                label = e.source if blend else os.path.basename(p.where.source_path)
                mix[str(label)] += p.tokens
        out.append(mix)
    return out


def _rows(mix: list[Counter[str]], start: int) -> list[chart.Row]:
    """At most ``MAX_ROWS`` rows: consecutive steps summed into buckets when more."""
    per = max(1, -(-len(mix) // MAX_ROWS))
    rows: list[chart.Row] = []
    for i in range(0, len(mix), per):
        total: Counter[str] = Counter()
        for m in mix[i: i + per]:
            total.update(m)
        a, b = start + i, start + min(i + per, len(mix)) - 1
        rows.append((f"step {a}" if a == b else f"steps {a}-{b}", total))
    return rows


def terminal_chart(mix: list[Counter[str]], start: int, width: int = 50) -> str:
    """One stacked bar per step (or bucket of steps), shares in percent, a legend."""
    return chart.terminal_chart(_rows(mix, start), width=width)


def svg_chart(mix: list[Counter[str]], start: int) -> str:
    """The same chart as an SVG document: one horizontal stacked bar per row."""
    return chart.svg_chart(_rows(mix, start), unit="tokens")
