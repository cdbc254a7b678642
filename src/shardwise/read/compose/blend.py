"""Blending datasets with fixed weights: a deterministic per-example choice of source.

Example ``i`` of a blend is example ``offset`` of source ``src``, where ``(src, offset)``
comes from :class:`~shardwise.plan.blend.BlendSchedule` (Tijdeman's greedy: every prefix
holds each source's share to within one example, and a source of weight ``w`` appears
within ``ceil(1/w)`` examples, so a small weight never rounds to zero). ``offset`` indexes
the source's *own* global order, so the blend inherits each source's shuffle and epochs::

    weights [0.5, 0.3, 0.2]
    blend i     0    1    2    3    4    5    6    7
    (src, off)  0,0  1,0  0,1  2,0  0,2  1,1  0,3  2,1

``seed`` relabels the sources before scheduling (a keyed permutation), so two seeds give
different interleavings with the same guarantee.

A **schedule** changes the weights at given examples of the blend's order
(``schedule=[(0, {"web": .7, "code": .3}), (51_200_000, {"web": .4, "code": .3, "math":
.3})]``, by name or position; :mod:`~shardwise.read.compose.schedule`): each stage keeps
the guarantee counted from its own start and every source continues with its next example
(:class:`~shardwise.plan.blend.StagedBlend`). Every source is listed from the start (weight 0
until its stage). Stages that start at or after a state's position may be added, changed
or removed and the run still resumes exactly; an earlier one that differs is refused,
named (:func:`~shardwise.checkpoint.staged`). ``len()`` follows the first stage's weights.
``counts_at(t)`` / ``tokens_seen(t)`` report what each source gave the first ``t``.

Two ways to read a blend:

* **map-style** (every source has ``len`` and ``[i]``, e.g.
  :class:`~shardwise.read.tokens.dataset.TokenDataset`): ``blend[i]``, ``__getitems__``
  (indices grouped by source, one batched call per source), ``len()`` and
  ``state_config()`` — use it with ``shardwise.torch.loader``, whose state (examples
  consumed) is the whole position. A TokenDataset takes any offset (later epochs are
  reshuffled); other sources wrap around (``offset % len``). ``len()`` is nominal: about
  as many examples as the sources hold, ``min_j len_j / w_j``; indices go on past it.
  ``locate(indices)`` says where examples come from: each one's source, its position in
  that source's order (``place``: the schedule alone) and that source's runs of stored
  tokens (its own ``locate``); ``prefetch`` downloads those chunks of remote sources.
* **iterable** (any source may be a stream with ``state_dict`` / ``load_state_dict``):
  ``for example in blend``; the blend ends when an iterable source runs out.

State keys (iterating, a :class:`~shardwise.checkpoint.LoaderState` of kind ``blend``):
``consumed``; ``extra = {"counts": examples taken per source, "sources": each iterable
source's own state (None for map-style ones, whose position is their count)}``, plus
``"stage_counts"`` (the counts at the start of the current stage) with a schedule. A
loader's state carries the same as seek hints ``blend_counts`` / ``blend_stage_counts``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import LoaderState, Resumable, as_count
from shardwise.errors import ConfigError, StateError
from shardwise.plan.blend import BLEND_VERSION, StagedBlend
from shardwise.plan.permutation import Permutation, derive_seed
from shardwise.read.ahead import reads_remotely, worker_read
from shardwise.read.compose.blend_rows import (
    BlendRuns,
    assemble,
    locate_sources,
    prefetch_sources,
    source_output,
)
from shardwise.read.compose.schedule import BlendConfig, Weights, mixture
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.epochs import EpochView
from shardwise.read.examples import NEXT_TOKEN, Output, check_same_layout
from shardwise.read.guard import GuardedReader, Placed, PlacedByLoader
from shardwise.read.orders import PAD
from shardwise.read.reader_config import source_identity
from shardwise.read.rows import ROW_FREE, Rows, own_example, stacked
from shardwise.read.tokens.dataset import TokenDataset
from shardwise.world import World

_PLAN_AHEAD = 1024
Batch = dict[str, npt.NDArray[Any]]


def _is_map(ds: Any) -> bool:
    return hasattr(ds, "__getitem__") and hasattr(ds, "__len__")


def _seq_len(ds: Any) -> int | None:
    """Positions per example: a TokenDataset's or StreamDataset's ``config.seq_len``, a
    PackedSFT's ``seq_len``; ``None`` for records of no fixed length."""
    for owner in (getattr(ds, "config", None), ds):
        L = getattr(owner, "seq_len", None)
        if isinstance(L, int) and not isinstance(L, bool):
            return L
    return None


def _is_stream(ds: Any) -> bool:
    return all(hasattr(ds, a) for a in ("__iter__", "state_dict", "load_state_dict"))


class Blend(GuardedReader, PlacedByLoader, EpochView, Resumable):
    """Sources mixed with ``weights``; map-style when every source is, else iterable.

    Its order is a :class:`~shardwise.read.compose.schedule.BlendConfig`: ``weights`` or
    ``schedule`` and ``names`` (turned into its fields by ``mixture``), its other fields
    (``seed``, ``length``) as keyword arguments, or ``config=`` one. ``output``: the
    examples' form (:class:`~shardwise.read.examples.Output`), set on the blend (its
    sources keep the default form).

    >>> mix = Blend([web, code], weights=[0.7, 0.3], names=["web", "code"])  # doctest: +SKIP
    >>> dl = loader(mix, global_batch_size=64, micro_batch_size=8)           # doctest: +SKIP
    >>> mix.report(dl.consumed)["sources"][1]["count"]                      # doctest: +SKIP
    """

    state_kind = "blend"
    label_convention = NEXT_TOKEN  # every part agrees (checked): read/examples.py
    config_class = BlendConfig  # what it is built from: its arguments, state and fingerprint

    def __init__(self, datasets: Sequence[Any], weights: Weights | None = None, *,
                 config: BlendConfig | None = None, names: Sequence[str] | None = None,
                 schedule: Sequence[tuple[int, Weights]] | None = None,
                 output: Output | None = None, world: World | None = None,
                 **options: Any) -> None:
        self._bind_world(world)  # map-style: placed by its loader, as a TokenDataset
        self.sources = list(datasets)
        self.output, self._stored = source_output(self.sources, Output.of(output))
        if config is None or weights is not None or schedule is not None or names is not None:
            options.update(mixture(len(self.sources), weights, schedule, names))
        config = self.config_class.of(config, options)
        if len(config.names) != len(self.sources):
            raise ConfigError(f"the blend's config names {list(config.names)}: one name "
                              f"per source, and there are {len(self.sources)} sources")
        self.names, self.stages = list(config.names), config.stages()
        self.weights, self.seed = self.stages[0][1], config.seed
        k = len(self.sources)
        bad = [n for n, d in zip(self.names, self.sources, strict=True)
               if not (_is_map(d) or _is_stream(d))]
        if bad:
            raise ConfigError(f"sources {bad} are neither map-style (len and [i]) nor "
                              "streams (iterable with state_dict / load_state_dict)")
        check_same_layout(self.sources, self.names)
        self.map_style = all(_is_map(d) for d in self.sources)
        self._relabel = Permutation(k, derive_seed(self.seed, "blend"), 0)(np.arange(k))
        self._schedule = StagedBlend([(s, w[self._relabel]) for s, w in self.stages])
        self._length = self._nominal_length(config.length)
        self.config = replace(config, length=self._length)  # as its state holds it
        self._consumed = 0
        self._iters: dict[int, Iterator[Any]] = {}
        self._ahead: tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None
        self.exhausted: str | None = None

    def _nominal_length(self, length: int | None) -> int | None:
        if length is not None:
            return length
        if not self.map_style:
            return None
        return max(1, min(int(len(d) / w) for d, w in zip(self.sources, self.weights,
                                                          strict=True) if w > 0))

    # -- the schedule -------------------------------------------------------------------
    def place(self, indices: npt.ArrayLike) -> tuple[npt.NDArray[np.int64],
                                                     npt.NDArray[np.int64]]:
        """``(source, offset)`` of blend examples ``indices`` (any shape): the schedule."""
        idx = np.asarray(indices, dtype=np.int64)
        lo, hi = (int(idx.min()), int(idx.max()) + 1) if idx.size else (0, 0)
        if idx.size and lo >= 0 and hi - lo <= 4 * idx.size + _PLAN_AHEAD:
            s, off = self._schedule.slice(lo, hi)  # a micro-batch is a run: ~20x cheaper
            s, off = s[idx - lo], off[idx - lo]
        else:
            s, off = self._schedule(idx)
        return self._relabel[s], off

    def locate(self, indices: npt.ArrayLike) -> BlendRuns:
        """Blend examples ``indices`` (``>= 0``): each one's source and position in that
        source's order (:meth:`place`), and per source the runs of stored tokens behind
        its examples, in example order (its ``locate``: a TokenDataset's order; ``None``
        for a source that has none, or no example here)."""
        src, off = self.place(np.asarray(indices, dtype=np.int64).reshape(-1))
        return locate_sources(self.sources, src, off, self._offsets)

    def prefetch(self, indices: list[int], *, early: bool = True) -> bool:
        """Start downloading the chunks examples ``indices`` read, for each source on an
        object store (through :meth:`locate`); True when a cache wants the coming
        examples sooner (``TokenDataset.prefetch``); ``early`` is moot (no early reads)."""
        if not reads_remotely(self):
            return False
        idx = np.asarray(self.positions(list(indices)), dtype=np.int64)
        return prefetch_sources(self.sources, self.locate(idx[idx >= 0]))

    def counts_at(self, t: int) -> npt.NDArray[np.int64]:
        """Examples taken from each source among the first ``t`` of the blend (``t`` =
        steps × global batch size). O(sources) where the schedule knows the position (a
        stage start once computed, a restored state's position); elsewhere the rule runs
        from the latest known position (:mod:`shardwise.plan.blend`: the cost)."""
        counts = np.zeros(len(self.sources), dtype=np.int64)
        counts[self._relabel] = self._schedule.counts_at(t)
        return counts

    def stage_start_counts(self, t: int) -> npt.NDArray[np.int64]:
        """Examples taken from each source before the stage that position ``t`` is in."""
        counts = np.zeros(len(self.sources), dtype=np.int64)
        counts[self._relabel] = self._schedule.base(self._schedule.stage_of(t))
        return counts

    def _as_counts(self, counts: Any, name: str) -> npt.NDArray[np.int64]:
        if not isinstance(counts, list | tuple) or len(counts) != len(self.sources):
            raise StateError(f"{name} must be a list of {len(self.sources)} counts, "
                             f"got {counts!r}")
        out = [as_count(c, f"{name}[{j}]") for j, c in enumerate(counts)]
        return np.asarray(out, dtype=np.int64)[self._relabel]

    def seed_counts(self, t: int, counts: Sequence[int],
                    stage_counts: Sequence[int] | None = None) -> None:
        """Resume the schedule at ``t`` from saved per-source counts (and, past the first
        stage, the counts at the start of ``t``'s stage): O(one block), not O(t); refuses
        counts no blend with these weights could have."""
        mine = self._as_counts(counts, "blend counts")
        base = None if stage_counts is None else self._as_counts(stage_counts,
                                                                  "blend stage counts")
        try:
            self._schedule.seed(t, mine, base)
        except ValueError as e:
            raise StateError(f"blend counts {list(counts)} do not fit this blend at {t} "
                             f"examples: {e}") from None

    def seek_hints(self, consumed: int) -> dict[str, Any]:
        """What a loader checkpoint adds so a restore seeks in O(1): the counts at
        ``consumed`` (and at the start of its stage, for a schedule)."""
        hints = {"blend_counts": self.counts_at(consumed).tolist()}
        if len(self.stages) > 1:
            hints["blend_stage_counts"] = self.stage_start_counts(consumed).tolist()
        return hints

    def apply_seek_hints(self, consumed: int, hints: Mapping[str, Any]) -> None:
        counts = hints.get("blend_counts")
        if counts is not None:
            self.seed_counts(consumed, counts, hints.get("blend_stage_counts"))

    def report(self, consumed: int | None = None) -> dict[str, Any]:
        """Per-source consumption after ``consumed`` examples (default: what this object
        has yielded): counts, tokens, the current stage's weights, realised proportions
        and the deviation in examples counted from the stage's start (the guarantee)."""
        t = self._consumed if consumed is None else consumed
        counts, base = self.counts_at(t), self.stage_start_counts(t)
        k = self._schedule.stage_of(t)
        start, weights = self.stages[k]
        rows = [{"name": n, "weight": float(w), "count": int(c), "tokens": tokens,
                 "realised": float(c / t) if t else 0.0,
                 "deviation": float(c - b - w * (t - start))}
                for n, w, c, b, tokens in zip(self.names, weights, counts, base,
                                              self.tokens_seen(t).values(), strict=True)]
        return {"consumed": t, "stage": k, "stage_start": start, "sources": rows,
                "max_deviation": max(abs(r["deviation"]) for r in rows)}  # type: ignore[arg-type]

    def tokens_seen(self, t: int) -> dict[str, int | None]:
        """Tokens each source gave the first ``t`` examples, in O(sources) when ``t`` is
        known to the schedule (see :meth:`counts_at`): examples × ``seq_len`` for sources
        whose examples are ``seq_len`` positions (a TokenDataset: input tokens, each
        window's one extra label token not counted; a PackedSFT: positions, padding
        included); ``None`` for sources of records of no fixed length."""
        counts = self.counts_at(t)
        return {n: None if (L := _seq_len(ds)) is None else int(c) * L
                for n, ds, c in zip(self.names, self.sources, counts, strict=True)}

    # -- identity -------------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        """Weights, names, seed, schedule version and each source's fingerprint."""
        cfg = {**self.config.state(), "blend_version": BLEND_VERSION}
        for n, d in zip(self.names, self.sources, strict=True):
            cfg[f"source.{n}"] = source_identity(d)
        return cfg

    def __repr__(self) -> str:
        mix = ", ".join(f"{n}={w:.3g}" for n, w in zip(self.names, self.weights, strict=True))
        return f"Blend({mix}, seed={self.seed}, {describe_drops(self.drops())})"

    def drops(self) -> list[Drop]:
        """What the sources leave out, each named."""
        return [Drop(d.count, d.unit, f"{n}: {d.reason}", d.of)
                for n, ds in zip(self.names, self.sources, strict=True)
                for d in (ds.drops() if callable(getattr(ds, "drops", None)) else [])]

    @property
    def pads(self) -> bool:
        """Whether index :data:`PAD` gives a masked example (the first source's)."""
        return bool(getattr(self.sources[0], "pads", False))

    # -- map-style ------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("a blend of streams has no len(); pass length=... or iterate it")
        return self._length

    def _offsets(self, j: int, off: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        ds = self.sources[j]
        return off if isinstance(ds, TokenDataset) else off % len(ds)

    def _fetch(self, j: int, idx: npt.NDArray[np.int64]) -> Batch:
        ds = self.sources[j]  # the blend's own read was placed (or deliberate): so is this
        if hasattr(ds, "get_batch"):
            return ds.get_batch(Placed(idx.tolist()))  # type: ignore[no-any-return]
        if hasattr(ds, "__getitems__"):
            got = ds.__getitems__(Placed(idx.tolist()))
            if stacked(got) is not None:
                return stacked(got)  # type: ignore[return-value]
        else:
            got = [ds[int(i)] for i in idx]
        return {k: np.stack([np.asarray(g[k]) for g in got]) for k in got[0]}

    def __getitems__(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Rows:
        """:meth:`get_batch` as torch's protocol wants it: a list of per-example dicts
        that also carries the stacked arrays (:class:`~shardwise.read.rows.Rows`); in a
        DataLoader worker, the caller's pace to the caches (``worker_read``)."""
        return Rows(worker_read(self, indices, lambda: self.get_batch(indices)))

    _getitems = __getitems__  # Grain's batched read (see read/rows.py)

    def get_batch(self, indices: Sequence[int] | npt.NDArray[np.integer]) -> Batch:
        """A micro-batch: one batched call per source, rows back in the asked order.
        Index :data:`PAD` asks the first source for a masked padding row."""
        if not self.map_style:
            raise TypeError(f"{self!r} has stream sources: iterate it instead")
        self.check_placed(indices)
        idx = np.asarray(self.positions(indices), dtype=np.int64).reshape(-1)
        if (idx < PAD).any():
            raise IndexError(f"blend indices must be >= 0 (or {PAD}), got {int(idx.min())}")
        rows = np.flatnonzero(idx >= 0)
        src, off = self.place(idx[rows])
        parts: list[tuple[npt.NDArray[np.intp], Batch]] = []
        if rows.size < idx.size:
            parts.append((np.flatnonzero(idx < 0), self._fetch(0, idx[idx < 0])))
        for j in np.unique(src).tolist():
            sel = src == j
            parts.append((rows[sel], self._fetch(j, self._offsets(j, off[sel]))))
        batch = assemble(parts, idx.size, self.names)
        return batch if self.output.is_default else self.output.shape(batch, self._stored)

    def __getitem__(self, index: int) -> dict[str, npt.NDArray[Any]]:
        batch = self.get_batch([int(index)])
        return {k: (v if k in ROW_FREE else v[0]) for k, v in batch.items()}

    # -- iterable -------------------------------------------------------------------------
    def _next_source(self) -> tuple[int, int]:
        t = self._consumed
        if self._ahead is None or not self._ahead[0] <= t < self._ahead[0] + len(self._ahead[1]):
            s, off = self._schedule.slice(t, t + _PLAN_AHEAD)
            self._ahead = (t, self._relabel[s], off)
        base, s, off = self._ahead
        return int(s[t - base]), int(off[t - base])

    def __iter__(self) -> Iterator[Any]:
        """Examples from the current position on (a fresh blend starts at 0). Every
        example in turn: in a multi-rank job, map-style sources are read this way only
        with ``world=World.single()`` (each rank would read the same ones)."""
        if any(_is_map(d) for d in self.sources):
            self.check_placed(None)
        while True:
            j, off = self._next_source()
            ds = self.sources[j]
            if _is_map(ds):
                example = own_example(ds, int(self._offsets(j, np.asarray([off]))[0]))
            else:
                if j not in self._iters:
                    self._iters[j] = iter(ds)
                try:
                    example = next(self._iters[j])
                except StopIteration:
                    self.exhausted = self.names[j]
                    return
            self._consumed += 1
            yield example if self.output.is_default else self.output.shape(
                example, self._stored, keep=("loss_mask", "position_ids"))

    def _position(self) -> tuple[int, dict[str, Any]]:
        streams = [None if _is_map(d) else d.state_dict() for d in self.sources]
        extra = {"counts": self.counts_at(self._consumed).tolist(), "sources": streams}
        if len(self.stages) > 1:
            extra["stage_counts"] = self.stage_start_counts(self._consumed).tolist()
        return self._consumed, extra

    def _seek(self, st: LoaderState) -> None:
        """Continue where the state was saved (per-source counts and source states)."""
        saved = st.extra.get("counts")
        if not isinstance(saved, list) or len(saved) != len(self.sources):
            raise StateError(f"the state has no per-source counts for {self.names}")
        # O(one block) instead of replaying the schedule from 0; the fingerprint pins the
        # schedule version and the counts are checked against the weights' quota
        self.seed_counts(st.consumed, saved, st.extra.get("stage_counts"))
        streams = st.extra.get("sources")
        if not isinstance(streams, list) or len(streams) != len(self.sources):
            raise StateError(f"the state has no per-source states for {self.names}")
        for d, s in zip(self.sources, streams, strict=True):
            if not _is_map(d):
                d.load_state_dict(s)
        self._consumed, self._iters, self.exhausted = st.consumed, {}, None


__all__ = ["Blend"]
