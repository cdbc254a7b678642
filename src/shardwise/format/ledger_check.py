"""What every loader of a ledger checks before anything reads by it: a cache is untrusted
input (contract 11), and the ledger is the one file every reader plans from.

Why here and not only in ``verify``: a ledger (or a journal record after it) that names
``../../x`` or lists chunk 0 forty times, or a chunk of ``-300`` tokens, used to be read
as it said — a reader served 4,887 or 3,499 examples of a 4,345-example cache without an
error — while ``verify`` said BAD (locally; through a bucket, OK). Now the loader itself
refuses such a ledger, and ``verify`` reports the same findings (all of them, not only the
first) from the same generator, :func:`ledger_problems`::

    source 0 segment 1 chunk 3: tokens is -300, expected a count in [0, 281474976710656]
    source 0 segment 0 chunk 1: stem 'chunks/00000/00000-00000' already named by
                                source 0 segment 0 chunk 0

Types are checked too (a JSON ``"3"`` where a count belongs), so no later sum, slice or
comparison meets a value of the wrong type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardwise.format.paths import CONTROL

if TYPE_CHECKING:
    from shardwise.format.ledger import ChunkEntry, Ledger, Segment

_BAD_STEM = re.compile(r"[\x00-\x1f\x7f\\]|^/|(?:^|/)\.{1,2}(?:/|$)|//|/$|^$|://")
"""What no stem may hold: control characters (a NUL, a newline), a backslash, a leading
``/``, a ``.`` or ``..`` part, an empty part, a URL scheme. A stem is a relative path
inside the cache, and one spelling per file (``a/./b`` would alias ``a/b``)."""
_COUNTS = ("documents", "tokens", "empty")
_POSITIONS = ("start", "stop", "position", "line")


MAX_COUNT = 1 << 48
"""No count a cache holds comes near it (2.8e14 tokens in one chunk); a larger one is
hostile, and sums of such counts would overflow the int64 prefix sums readers plan by."""
MAX_TOTAL = 1 << 62


def is_count(v: Any) -> bool:
    """A JSON integer in ``[0, MAX_COUNT]`` (not a bool, a float or a string)."""
    return type(v) is int and 0 <= v <= MAX_COUNT


def stem_problem(stem: Any) -> str | None:
    """Why ``stem`` cannot name a chunk (None: it can)."""
    if not isinstance(stem, str):
        return f"stem is {stem!r}, expected str"
    if CONTROL.search(stem):  # a newline would forge a line of the verified log
        return f"names {stem!r}, which holds a control character; a stem is a plain path"
    if _BAD_STEM.search(stem):
        return (f"names {stem!r}, not a relative path inside the cache (no '..', '.', "
                "absolute path or backslash)")
    return None


def entry_problems(entry: ChunkEntry, *, counts_empty: bool = True) -> list[str]:
    """Why a chunk entry cannot be read by (empty: it can). ``counts_empty``: the ledger
    records empty documents (version 1 did not: its ``empty`` reads as 0, so a chunk of
    empty documents may hold fewer tokens than documents)."""
    out = [f"{k} is {v!r}, expected " + (f"a count in [0, {MAX_COUNT}]" if type(v) is int
                                          else "int")
           for k, v in ((k, getattr(entry, k)) for k in _COUNTS) if not is_count(v)]
    stem = stem_problem(entry.stem)
    if stem:
        out.append(stem)
    if not isinstance(entry.meta_xxh3, str):
        out.append(f"meta_xxh3 is {entry.meta_xxh3!r}, expected str")
    if not out and entry.empty > entry.documents:
        out.append(f"{entry.empty} empty documents of {entry.documents}")
    if not out and counts_empty and entry.tokens < entry.documents - entry.empty:
        # every document that is not empty holds at least one token
        out.append(f"{entry.tokens} tokens for {entry.documents - entry.empty} documents "
                   "that are not empty")
    return out


def segment_problems(seg: Segment) -> list[str]:
    """Field types of a segment (its positions' order is ``verify``'s to judge)."""
    out = [f"{k} is {getattr(seg, k)!r}, expected int" for k in _POSITIONS
           if type(getattr(seg, k)) is not int]
    if not isinstance(seg.finished, bool):
        out.append(f"finished is {seg.finished!r}, expected true or false")
    if not isinstance(seg.chunks, list):
        out.append(f"chunks is {type(seg.chunks).__name__}, expected a list")
    errors = seg.errors
    if not isinstance(errors, dict) or not all(is_count(v) for v in errors.values()):
        out.append(f"errors is {errors!r:.80}, expected counts by reason")
    return out


def ledger_problems(ledger: Ledger) -> Iterator[tuple[int, int, int, str]]:
    """Every problem as ``(source, segment, chunk, what)`` (chunk -1: the segment's own);
    a chunk whose stem an earlier one already named is a problem of the later one."""
    seen: dict[str, tuple[int, int, int]] = {}
    total = 0
    for s, src in enumerate(ledger.sources):
        for g, seg in enumerate(src.segments):
            bad = segment_problems(seg)
            for what in bad:
                yield s, g, -1, what
            if not isinstance(seg.chunks, list):
                continue
            sound = not bad
            for k, entry in enumerate(seg.chunks):
                found = entry_problems(entry, counts_empty=ledger.version != 1)
                for what in found:
                    yield s, g, k, what
                if found:
                    sound = False
                    continue
                total += entry.tokens + entry.documents
                if total > MAX_TOTAL:
                    yield s, g, k, f"the ledger's tokens add up past {MAX_TOTAL}"
                    return
                first = seen.setdefault(entry.stem, (s, g, k))
                if first != (s, g, k):
                    yield s, g, k, (f"stem {entry.stem!r} already named by source {first[0]} "
                                    f"segment {first[1]} chunk {first[2]}")
            missing = sound and lines_problem(seg)
            if missing:
                yield s, g, -1, missing


def lines_problem(seg: Segment) -> str | None:
    """Why a segment's chunks cannot be all it read (None: they can). Every line (row) a
    build read up to ``line`` became a document of a chunk or a skipped record counted in
    ``errors``, so fewer documents and skipped records than lines means a chunk entry is
    missing: a ledger or journal record that left one out (or all: ``"chunks": []``) made
    readers serve 44 or 38 of 54 examples, silently. More is no loss (a truncated stream's
    error, caches built before ``line`` was kept, where it reads 0)."""
    documents = sum(e.documents for e in seg.chunks)
    skipped = sum(seg.errors.values())
    if documents + skipped >= seg.line:
        return None
    return (f"its chunks hold {documents} documents and it skipped {skipped} records, but "
            f"it read {seg.line} lines (rows): a chunk is missing from the ledger")


def where_in(s: int, g: int, k: int) -> str:
    return f"source {s} segment {g}" + (f" chunk {k}" if k >= 0 else "")


__all__ = ["MAX_COUNT", "MAX_TOTAL", "entry_problems", "is_count", "ledger_problems",
           "lines_problem", "segment_problems", "stem_problem", "where_in"]
