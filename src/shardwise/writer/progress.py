"""Build progress: a live bar on a terminal, plain periodic lines otherwise, and a summary.

Work is counted in segments (a plain-JSONL segment also advances by its bytes as it goes),
so the ETA is honest for compressed and Parquet sources too.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


def _rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.1f}{prefix}{unit}"
    return f"{x:.0f}{unit}"


@dataclass
class BuildSummary:
    """What a build did; ``str()`` is the human summary the CLI prints."""

    root: str
    sources: int
    chunks: int
    documents: int
    tokens: int
    bytes_read: int
    seconds: float
    errors: dict[str, int] = field(default_factory=dict)
    resumed_chunks: int = 0
    new_chunks: int = 0
    checked_chunks: int = 0  # chunks of an earlier run checked before continuing
    check_depth: str = ""  # "checksums" (size + xxh3 of every file), "sizes", "" (none)
    check_seconds: float = 0.0
    rebuilt_chunks: dict[str, str] = field(default_factory=dict)  # stem -> what was wrong
    empty_documents: int = 0
    """Documents with no token (an empty text), counted in ``documents`` too."""
    notes: list[str] = field(default_factory=list)
    """Things the build changed on its own, said once (e.g. tokenizer truncation off)."""
    ledger_seconds: float = 0.0
    """Time spent saving progress: journal records and ledger snapshots."""
    ledger_records: int = 0
    ledger_snapshots: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        s = max(self.seconds, 1e-9)
        empty = f" ({self.empty_documents:,} empty)" if self.empty_documents else ""
        lines = [
            f"built {self.root}: {self.sources} sources, {self.chunks} chunks, "
            f"{self.documents:,} documents{empty}, {self.tokens:,} tokens",
            f"  {self.seconds:.1f} s  {_rate(self.tokens / s, ' tok/s')}  "
            f"{_rate(self.bytes_read / s, 'B/s')} read  ({self.new_chunks} chunks new, "
            f"{self.resumed_chunks} kept from an earlier run"
            + (f", {len(self.rebuilt_chunks)} rebuilt)" if self.rebuilt_chunks else ")"),
        ]
        if self.checked_chunks:
            how = "size + xxh3 of every file" if self.check_depth == "checksums" else (
                "sizes only")
            lines.append(f"  checked {self.checked_chunks} chunks of an earlier run ({how}) "
                         f"in {self.check_seconds:.1f} s"
                         + ("" if self.rebuilt_chunks else ": all intact"))
        if self.rebuilt_chunks:
            shown = list(self.rebuilt_chunks.items())[:10]
            more = len(self.rebuilt_chunks) - len(shown)
            n = len(self.rebuilt_chunks)
            lines.append(f"  rebuilt {n} damaged chunk{'s' if n != 1 else ''}: "
                         + ", ".join(f"{stem} ({why})" for stem, why in shown)
                         + (f" and {more} more" if more else ""))
        if self.errors:
            total = sum(self.errors.values())
            detail = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items()))
            lines.append(f"  skipped {total:,} bad records ({detail})")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


class ProgressReporter:
    """Counts documents, tokens and bytes; draws a tqdm bar on a TTY or logs every
    ``interval`` seconds otherwise. ``enabled=False`` keeps it silent."""

    def __init__(self, total_units: float, *, enabled: bool | None = None,
                 interval: float = 10.0, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = True if enabled is None else enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self.total = total_units
        self.done = 0.0
        self.documents = self.tokens = self.bytes_read = 0
        self.start = self._last_log = time.monotonic()
        self._bar: Any = None
        if self.enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=round(total_units, 3), unit="seg", file=self.stream,
                             dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f}"
                             " [{elapsed}<{remaining}{postfix}]")

    def advance(self, units: float, documents: int = 0, tokens: int = 0,
                nbytes: int = 0) -> None:
        self.done += units
        self.documents += documents
        self.tokens += tokens
        self.bytes_read += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if self._bar is not None:
            self._bar.update(units)
            if now - self._last_log > 0.5:
                self._bar.set_postfix_str(self._rates(now), refresh=False)
                self._last_log = now
        elif now - self._last_log >= self.interval:
            self._last_log = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            print(f"shardwise build: {pct:5.1f}%  {self.documents:,} docs  {self.tokens:,} "
                  f"tokens  {self._rates(now)}  eta {self._eta(now)}", file=self.stream,
                  flush=True)

    def _rates(self, now: float) -> str:
        s = max(now - self.start, 1e-9)
        return (f"{_rate(self.documents / s, ' doc/s')}, {_rate(self.tokens / s, ' tok/s')}, "
                f"{self.bytes_read / s / 1e6:.1f} MB/s")

    def _eta(self, now: float) -> str:
        if self.done <= 0:
            return "?"
        left = (now - self.start) * (self.total - self.done) / self.done
        return f"{left:.0f}s"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
