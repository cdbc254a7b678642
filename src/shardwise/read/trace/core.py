"""``trace``: what the model saw at a global step, by rank, micro-batch, file and line.

Why: after a loss spike at step 48,213 you want that step's documents, by source line. The
global order is a pure function of (cache, read config, seed), so each example of a step
is found in O(1)-ish from its position — no replay of the run:

1. *placement*: which positions of the global order step ``s`` reads, and where —
   the BatchSampler's own ``micro_batch(k)`` for each rank and accumulation step (global
   placement, skip ranges included), the stream rule "rank ``r``'s ``j``-th example is
   global ``j·R + r``" (stream placement, and PackedSFT's rows);
2. *example*: a position → runs of a cache's stored token stream
   (:mod:`~shardwise.read.trace.examples`);
3. *documents*: runs → pieces (document, offset, tokens) → source file and line
   (:mod:`~shardwise.read.trace.lines`).

Example offsets (``at``) index the example's window of ``seq_len + 1`` tokens
(``input_ids`` is its first ``seq_len``, the labels its last): a packed SFT row's index
its ``input_ids``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardwise.errors import ConfigError
from shardwise.format.paths import redact_url
from shardwise.plan.skips import skipped_in
from shardwise.plan.stream import rank_example_to_global
from shardwise.read.compose.sft_rows import SftRows
from shardwise.read.config import ReadConfig, ReaderKind, check_state
from shardwise.read.trace.examples import stored_runs, stream_runs, token_runs
from shardwise.read.trace.lines import Documents, Where
from shardwise.world import World

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class Piece:
    """A run of one document inside an example: example tokens ``[at, at + tokens)`` are
    the document's tokens ``[doc_offset, doc_offset + tokens)``."""

    at: int
    tokens: int
    document: int
    doc_offset: int
    where: Where
    ids: list[int] | None = None
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"at": self.at, "tokens": self.tokens, "document": self.document,
               "doc_offset": self.doc_offset, **self.where.to_dict()}
        if self.ids is not None:
            out["ids"] = self.ids
        if self.text is not None:
            out["text"] = self.text
        return out


@dataclass(frozen=True)
class TracedExample:
    """Position ``position`` of the global order, read by ``rank`` in its micro-batch
    ``micro_batch`` (0‥accumulation-1 within the step) at row ``row``. ``status``:
    ``data``, ``skipped`` (the skip list leaves the step out: nobody reads it; ``rank``
    is who would have), ``pad`` (a masked padding example), ``end`` (past a finite run),
    ``unpublished`` (a stream block the build has not finished)."""

    position: int
    rank: int
    micro_batch: int
    row: int
    status: str = "data"
    source: str | None = None
    source_position: int | None = None
    pieces: list[Piece] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "rank": self.rank,
                "micro_batch": self.micro_batch, "row": self.row, "status": self.status,
                "source": self.source, "source_position": self.source_position,
                "pieces": [p.to_dict() for p in self.pieces]}


@dataclass(frozen=True)
class StepTrace:
    """The examples of global step ``step`` (or of an example range: ``step`` None)."""

    step: int | None
    examples: list[TracedExample]
    config: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "config": self.config,
                "examples": [e.to_dict() for e in self.examples]}


Slot = tuple[int, int, int, int, str]  # position, rank, micro-batch, row, status


class Tracer:
    """Traces steps of one read config; keeps the readers and small look-up caches, so
    tracing many steps (``trace --plot``) reuses them.

    ``lines=False`` skips source lines (chunks and files only: no chunk metadata read);
    ``ids`` adds each piece's token ids; ``decode`` (ids → text) adds its text;
    ``caches``: caches already open, by their path in the config; ``state``: the loader
    state the config came from (its seek hints speed up a blend's look-ups).
    """

    def __init__(self, config: ReadConfig, *, lines: bool = True, ids: bool = False,
                 decode: Decode | None = None, caches: Mapping[str, Any] | None = None,
                 state: Mapping[str, Any] | None = None) -> None:
        self.config, self.lines, self.decode = config, lines, decode
        self.ids = ids or decode is not None
        self.dataset, sampler = config.build(rank=0, caches=caches)
        if state is not None:
            check_state(self.dataset, state, sampler)
            # a loader state's seek hints (a Blend's per-source counts at its position)
            # make looking up examples near that position O(1), not O(position)
            if hasattr(self.dataset, "apply_seek_hints"):
                self.dataset.apply_seek_hints(int(state["consumed"]), state.get("extra", {}))
        kind = config.reader
        self._stream = kind is ReaderKind.STREAM
        self._sft = SftRows(self.dataset) if kind is ReaderKind.SFT else None
        if self._sft is not None and state is not None and state.get("kind") == "sft_pack":
            x = state.get("extra", {})
            self._sft.anchor(int(state["consumed"]), int(x["epoch"]), int(x["window"]),
                             int(x["bin"]))
        self._names = list(config.sources()) if config.blend is not None else [None]
        parts = self.dataset.sources if config.blend is not None else [self.dataset]
        self._parts = parts
        cache_of = (lambda d: d.records.cache) if kind is ReaderKind.SFT else (
            lambda d: d.cache)
        self._docs = [Documents(cache_of(d)) for d in parts]
        self._samplers: dict[int, Any] = {}

    # -- placement ------------------------------------------------------------------------
    def slots(self, step: int) -> list[Slot]:
        """Every example of global step ``step`` (positions ``[step·B, (step+1)·B)``):
        ``(position, rank, micro-batch, row, status)``, by rank, micro-batch and row."""
        c = self.config
        acc, m, W = c.accumulation, c.micro_batch_size, c.world_size
        out: list[Slot] = []
        for r in range(W):
            for a in range(acc):
                out += self._micro_step(r, a, step * c.global_batch_size + a * m * W)
        return sorted(out, key=lambda s: (s[1], s[2], s[3]))

    def _micro_step(self, rank: int, a: int, q: int) -> list[Slot]:
        """Rank ``rank``'s micro-batch (``a``-th of its step) of the micro-step at
        position ``q``. Global placement: the BatchSampler's own ``micro_batch`` from
        ``q``; a micro-step its skip list leaves out lists the positions it would have
        read, status ``skipped``. Stream placement and PackedSFT: rank ``r``'s ``j``-th
        example is global ``j·R + r`` (:func:`~shardwise.plan.stream.rank_example_to_global`);
        its skip ranges are whole global steps, so a micro-step is skipped whole or not."""
        c = self.config
        m, W = c.micro_batch_size, c.world_size
        if c.reader in (ReaderKind.STREAM, ReaderKind.SFT):  # readers that place themselves
            j0 = q // W
            status = "skipped" if skipped_in(c.skip_examples(), q, q + m * W) else "data"
            return [(int(rank_example_to_global(j0 + row, rank, W)), rank, a, row, status)
                    for row in range(m)]
        s = replace(self._sampler(rank), consumed=q)
        if s.skip and s.advance(1) - s.step_examples != q:  # the sampler jumps past q
            idx = replace(s, skip=()).micro_batch(0)
            return [(int(p), rank, a, row, "skipped") for row, p in enumerate(idx)]
        return [(int(p), rank, a, row, "data") for row, p in enumerate(s.micro_batch(0))]

    def _sampler(self, rank: int) -> Any:
        s = self._samplers.get(rank)
        if s is None:
            n = len(self.dataset) if self.config.reader is ReaderKind.TOKENS else 1
            s = self._samplers[rank] = self.config.sampler(n, World(rank,
                                                                    self.config.world_size))
        return s

    def placement(self, p: int) -> Slot:
        """The slot of position ``p``: found in its micro-step's slots (the same rules)."""
        c = self.config
        mw, B = c.micro_batch_size * c.world_size, c.global_batch_size
        q = p - p % mw
        for r in range(c.world_size):
            for slot in self._micro_step(r, (q % B) // mw, q):
                if slot[0] == p:
                    return slot
        raise ConfigError(f"position {p} is read by no rank of micro-step {q}")  # unreachable

    # -- tracing --------------------------------------------------------------------------
    def step(self, step: int) -> StepTrace:
        """Every example of global step ``step``."""
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}")
        return StepTrace(step, [self.example(s) for s in self.slots(step)], self.summary())

    def example_range(self, start: int, stop: int) -> StepTrace:
        """Positions ``[start, stop)`` of the global order."""
        if not 0 <= start < stop:
            raise ConfigError(f"the example range must be 0 <= start < stop, got "
                              f"[{start}, {stop})")
        return StepTrace(None, [self.example(self.placement(p)) for p in range(start, stop)],
                         self.summary())

    def summary(self) -> dict[str, Any]:
        c = self.config
        sources = {name: redact_url(path) for name, path in c.sources().items()}
        return {"reader": c.reader.value, "sources": sources, "seq_len": c.seq_len,
                "global_batch_size": c.global_batch_size,
                "micro_batch_size": c.micro_batch_size, "world_size": c.world_size,
                "skip": [list(r) for r in c.skip]}

    def example(self, slot: Slot) -> TracedExample:
        p, rank, mb, row, status = slot
        if status != "data":
            return TracedExample(p, rank, mb, row, status)
        kind = self.config.reader
        if kind is ReaderKind.SFT:
            return self._sft_example(slot)
        j, off = 0, p
        runs: list[tuple[int, int, int]] | str
        if self._stream:
            runs = stream_runs(self.dataset, p)
        elif self.config.blend is not None:
            where = self.dataset.locate([p])  # its source, position there, and runs
            j, off = int(where.source[0]), int(where.offset[0])
            runs = stored_runs(where.runs[j], self._parts[j].cache.cum_tokens)
        else:
            runs = token_runs(self.dataset, p)
        if isinstance(runs, str):
            return TracedExample(p, rank, mb, row, runs)
        pieces = [piece for at, a, b in runs for piece in self._pieces(j, at, a, b)]
        return TracedExample(p, rank, mb, row, "data", self._names[j],
                             off if self.config.blend is not None else None, pieces)

    def _pieces(self, j: int, at: int, start: int, stop: int) -> list[Piece]:
        docs, out = self._docs[j], []
        for c, k, off, n in docs.pieces(start, stop):
            ids = None
            if self.ids:
                s0 = docs.document_start(c, k) + off
                ids = np.asarray(docs.cache.read_tokens(s0, s0 + n)).tolist()
            out.append(self._piece(docs, at, c, k, off, n, ids))
            at += n
        return out

    def _piece(self, docs: Documents, at: int, c: int, k: int, off: int, n: int,
               ids: list[int] | None) -> Piece:
        where = docs.where(c, k) if self.lines else Where(
            _source_file(docs, c), docs.cache.chunks[c].stem, "chunk", 0, 0)
        text = self.decode(ids) if self.decode is not None and ids is not None else None
        return Piece(at, n, docs.document_id(c, k), off, where, ids, text)

    def _sft_example(self, slot: Slot) -> TracedExample:
        p, rank, mb, row, _ = slot
        assert self._sft is not None  # for mypy: set for the sft reader
        recs = self._sft.records(p)
        if recs is None:
            return TracedExample(p, rank, mb, row, "end")
        docs, pieces = self._docs[0], []
        for d, at, n in recs:
            c, k = docs.chunk_of_document(d)
            ids = None
            if self.ids:
                ids = np.asarray(self.dataset.records[d]["input_ids"][:n]).tolist()
            pieces.append(self._piece(docs, at, c, k, 0, n, ids))
        return TracedExample(p, rank, mb, row, "data", None, None, pieces)


def _source_file(docs: Documents, c: int) -> str:
    """The source file of chunk ``c`` from the manifest (no chunk metadata read)."""
    m, info = docs.cache.manifest, docs.cache.chunks[c]
    if m is None:
        return f"{info.base}.bin"
    return m.sources[info.source].shown


def trace(config: ReadConfig, step: int, **kwargs: Any) -> StepTrace:
    """The examples of global step ``step`` of the run ``config`` describes
    (see :class:`Tracer` for the keyword arguments)."""
    return Tracer(config, **kwargs).step(step)
