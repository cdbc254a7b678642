"""The one resumable-reader protocol: a state is kind, version, fingerprint and position.

A state says how many examples of the global order the consumer has *received* (never
what was prefetched), which configuration and data that order belongs to (``config`` and
its ``fingerprint``), and the version of the state layout. Where the global position alone
does not pin the reader (stream positions, a shuffle buffer's epoch), ``extra`` holds
the reader's own integers. Loading a state that does not match refuses loudly, naming
each difference; it never silently restarts from zero. Everything is plain JSON.

Every resumable reader is a :class:`Resumable`: it says what its order depends on
(``state_config``), where it is (``_position``) and how to continue (``_seek``); the
state's shape, the checks and the refusal are written once, here. Map-style datasets,
whose position lives in a sampler or loader, are :class:`Configured`: a fingerprinted
config, plus optional seek hints a loader stores with its own position (a Blend's
per-source counts make its seek O(1))::

    reader.state_dict()  ->  {"kind": "stream", "version": 1, "fingerprint": "9f2c…",
                              "consumed": 81920, "config": {...}, "extra": {...}}

>>> s = LoaderState(fingerprint="9f2c", consumed=81_920, config={"seq_len": 2048})
>>> LoaderState.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Number
from typing import Any, ClassVar

import orjson

from shardwise.errors import ShardwiseError, StateError

STATE_VERSION = 1


def as_count(value: Any, name: str, *, minimum: int = 0,
             error: type[ShardwiseError] = StateError) -> int:
    """``value`` as a plain ``int``, for every count or position a state or a reader takes.

    A training loop often holds its step counts as ``np.int64`` (numpy arithmetic) or
    ``torch.tensor(6)`` (all-reduced, loaded from a checkpoint); those are counts, and
    become ``int`` here so a state stays plain JSON. ``bool`` is not a count (``True``
    would silently mean 1), nor is a float, a string or an array of more than one value::

        as_count(np.int64(6), "consumed") == 6     as_count(torch.tensor(6), "c") == 6
        as_count(True, "consumed")  -> StateError  as_count(6.0, "consumed") -> StateError
    """
    kind = str(getattr(value, "dtype", ""))
    if isinstance(value, bool) or "bool" in kind or getattr(value, "ndim", 0) != 0:
        raise error(f"{name} must be an integer count, got {value!r}")
    try:
        v = operator.index(value)  # int, numpy integer, 0-d integer array or tensor
    except TypeError:
        raise error(f"{name} must be an integer count, got {value!r} "
                    f"({type(value).__name__})") from None
    if v < minimum:
        raise error(f"{name} must be >= {minimum}, got {v}")
    return v


def check_not_past_end(position: int, end: int | None, unit: str, run: str) -> None:
    """Refuse a position past the end of a finite run (``end`` ``None``: endless), which
    would otherwise yield nothing without a word. ``run`` says what bounds it."""
    if end is not None and position > end:
        raise StateError(f"the position is {position:,} {unit}, past the end of this run "
                         f"({end:,} {unit}: {run}); the state was saved by a longer run "
                         "(more epochs or samples?) or another dataset: resume with the "
                         "run length it was saved with")


def fingerprint(config: Mapping[str, Any]) -> str:
    """The fingerprint of a read config: 16 hex digits of SHA-256 over its sorted JSON."""
    blob = orjson.dumps(dict(config), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:16]


SKIP_KEY = "skip"  # a sampler's skip ranges in a state's config (see check_matches)

RETIRED: dict[str, Any] = {"block_size": 64, "blocks_per_group": 8}
"""Keys every TokenDataset state held, at these values, before an order owned its options
(the block order's, which no other order reads). A saved state holding one that the
reader's config no longer has is read as the no-op it was (not a difference), and its
fingerprint, taken with them, still matches (:meth:`LoaderState.check_matches`)."""


def retired_fingerprint(config: Mapping[str, Any]) -> str:
    """The fingerprint ``config`` had before the :data:`RETIRED` keys left it."""
    return fingerprint({**{k: v for k, v in RETIRED.items() if k not in config}, **config})


def _ranges(value: Any) -> list[tuple[int, int]]:
    try:
        return [(as_count(a, "skip start"), as_count(b, "skip stop")) for a, b in (value or ())]
    except (TypeError, ValueError):
        raise StateError(f"config.skip must be a list of [start, stop] pairs, got {value!r}; "
                         "the state was edited or damaged") from None


def _past_skip_differences(saved: Any, current: Any, consumed: int) -> list[str]:
    """Skip ranges whose part before ``consumed`` differs between a state and a reader
    (each compared clipped to ``[0, consumed)``, so extending a range past the position or
    splitting it there is not a difference).

    The past cannot change: what was served (or skipped) before ``consumed`` is what the
    state's list says, and ``shardwise trace`` of a past step must tell the truth, so
    ranges reaching before ``consumed`` must be the saved ones. Ranges at or after it may
    be added or removed: that is the skip-and-resume recipe (restore a checkpoint from
    before a loss spike, skip the steps around it); a position at the start of a new range
    continues at its end::

        saved at 800 with skip [(400, 480), (800, 960)]; resume with
          [(400, 480)]                ok: a future range removed
          [(400, 480), (800, 1040)]   ok: a future range grown
          [(400, 560)]                refused: [480, 560) was served
          [(400, 480), (720, 880)]    refused: 720 < 800
    """
    def past(ranges: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[int, int]]:
        return {(a, min(b, consumed)): (a, b) for a, b in ranges if a < consumed}

    old, new = past(_ranges(saved)), past(_ranges(current))
    where = (f"lies (at least partly) before the saved position ({consumed:,} examples of "
             "the global order)")
    out = [f"skip range [{a:,}, {b:,}) {where}, but the state was saved without it"
           for key, (a, b) in new.items() if key not in old]
    out += [f"the state was saved skipping [{a:,}, {b:,}), which {where}, but this reader's "
            "skip list no longer has it" for key, (a, b) in old.items() if key not in new]
    return out


STAGED = "staged_from"


def staged(entries: Any) -> dict[str, Any]:
    """A config value made of entries that each take effect from a position on — a blend
    schedule's later stages, a skip list's ranges: ``[(start, value), ...]``, ``start`` in
    examples of the reader's global order. A state saved at position ``p`` matches a
    reader whose entries starting before ``p`` are the same: entries at or after ``p`` may
    be added, changed or removed (nothing consumed so far depended on them), so a run can
    change its plan for later and still resume exactly. A key missing on one side counts
    as no entries::

        staged([(1000, [0.4, 0.6])]) == {"staged_from": [[1000, [0.4, 0.6]]]}
    """
    return {STAGED: [[int(start), value] for start, value in entries]}


def _started(value: Any, position: int) -> list[Any] | None:
    """The entries of a :func:`staged` value that start before ``position`` (a missing
    key: none); ``None`` when the value is not staged."""
    if value is None:
        return []
    entries = value.get(STAGED) if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(entries, list) or not all(
            isinstance(e, list) and e and isinstance(e[0], int) for e in entries):
        return None
    return [e for e in entries if e[0] < position]


def _stage_difference(key: str, saved: list[Any], current: list[Any], position: int) -> str:
    """Name the first entry starting before ``position`` that differs."""
    bad = next((x if x[0] <= y[0] else y for x, y in zip(saved, current, strict=False)
                if x != y), None) or max(saved, current, key=len)[min(len(saved), len(current))]
    return (f"{key}: the entry from example {bad[0]:,} differs (state has {saved!r}, this "
            f"reader has {current!r}); only entries starting at or after the saved position "
            f"{position:,} may change")


def _differences(saved: dict[str, Any], current: dict[str, Any], position: int) -> list[str]:
    """Every field that differs, except plans for after ``position``: a sampler's skip
    ranges and a :func:`staged` value's entries may differ from ``position`` on."""
    out: list[str] = []
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if a == b or (k in RETIRED and k not in current):
            continue
        if k == SKIP_KEY:
            out += _past_skip_differences(a, b, position)
            continue
        a_started, b_started = _started(a, position), _started(b, position)
        if a_started is None or b_started is None:
            out.append(f"{k}: state has {a!r}, this reader has {b!r}")
        elif a_started != b_started:
            out.append(_stage_difference(k, a_started, b_started, position))
    return out


MAX_DEPTH = 32
"""How deep a state's JSON may nest: a reader's config is a few levels (a blend of
sources, its stages); a state nested a thousand deep is hostile, and would meet Python's
recursion limit in the first comparison or hash of it."""


def plain_object(value: Any, name: str) -> dict[str, Any]:
    """``value`` as a state's ``config`` / ``extra``: a JSON object of plain JSON values
    (objects with string keys, lists, strings, numbers, booleans, null), at most
    :data:`MAX_DEPTH` deep; else a :class:`StateError` naming ``name``. Walked without
    recursion, so no depth is a crash."""
    if not isinstance(value, dict):
        raise StateError(f"state {name} is {type(value).__name__}, expected a JSON object; "
                         "the state was edited or is not a shardwise state")
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise StateError(f"state {name} nests deeper than {MAX_DEPTH} levels; the state "
                             "was edited or is not a shardwise state")
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise StateError(f"state {name} has a key that is not a string")
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list | tuple):
            todo += [(v, depth + 1) for v in item]
        elif not (item is None or isinstance(item, str | Number) or hasattr(item, "dtype")):
            # numbers include numpy's; a torch scalar has a dtype (as_count reads both)
            raise StateError(f"state {name} holds a {type(item).__name__}, not plain JSON")
    return dict(value)


@dataclass(frozen=True)
class LoaderState:
    """Position in a global order. ``config`` holds the plain fields the fingerprint
    covers, so a mismatch can say what differs. ``extra`` carries reader-specific
    integers (stream positions, epoch) as plain JSON."""

    fingerprint: str
    consumed: int
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = "loader"
    version: int = STATE_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumed", as_count(self.consumed, "consumed"))
        object.__setattr__(self, "version", as_count(self.version, "version"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "fingerprint": self.fingerprint,
                "consumed": self.consumed, "config": dict(self.config),
                "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, d: Any) -> LoaderState:
        if not isinstance(d, dict):
            raise StateError(f"a shardwise state is a dict, got {type(d).__name__}")
        missing = {"kind", "version", "fingerprint", "consumed"} - set(d)
        if missing:
            raise StateError(f"not a shardwise state: missing {sorted(missing)}")
        version = as_count(d["version"], "version")
        if version != STATE_VERSION:
            raise StateError(f"state version {version!r}; this shardwise reads version "
                             f"{STATE_VERSION}")
        for key in ("kind", "fingerprint"):
            if not isinstance(d[key], str):
                raise StateError(f"state {key} is {type(d[key]).__name__}, expected a string")
        return cls(fingerprint=d["fingerprint"], consumed=d["consumed"],
                   config=plain_object(d.get("config", {}), "config"),
                   extra=plain_object(d.get("extra", {}), "extra"),
                   kind=d["kind"], version=version)

    def check_matches(self, kind: str, fingerprint: str, config: dict[str, Any]) -> None:
        """Raise :class:`StateError` naming every difference from the current reader."""
        if self.kind != kind:
            raise StateError(f"this state belongs to a {self.kind!r} reader, not {kind!r}")
        if self.fingerprint == fingerprint or (self.config and self.config == config):
            return  # the same config (a state from before a fingerprint change included)
        if not self.config and self.fingerprint == retired_fingerprint(config):
            return  # saved before the retired keys left the config
        diffs = _differences(self.config, config, self.consumed)
        if self.config and not diffs:
            return  # only plans for later differ (skip ranges, staged entries)
        diffs = diffs or [
            f"fingerprint: state has {self.fingerprint}, this reader has {fingerprint}"]
        raise StateError("refusing to resume: the state does not match this data and "
                         "configuration:\n  " + "\n  ".join(diffs) + "\nresume with the "
                         "configuration and cache the state was saved with; plans for "
                         "later (skip ranges, a blend schedule's stages) may change at or "
                         f"after {self.consumed:,}, the saved position in examples")

    def extra_counts(self, *keys: str) -> tuple[int, ...]:
        """``extra[key]`` for each key, as integer counts; a :class:`StateError` naming the
        key when one is missing or not a count."""
        missing = [k for k in keys if k not in self.extra]
        if missing:
            raise StateError(f"a {self.kind!r} state needs extra.{missing[0]} (it has "
                             f"{sorted(self.extra)}); the state was edited or is not this "
                             "reader's")
        return tuple(as_count(self.extra[k], f"extra.{k}") for k in keys)


class Configured:
    """A reader whose order is a function of a plain config: one fingerprint for all.

    Map-style datasets are only this (a sampler or loader holds their position); they may
    add *seek hints*, integers a loader saves beside its own position so that a restore
    costs O(1) (:meth:`seek_hints`, :meth:`apply_seek_hints`).
    """

    def state_config(self) -> dict[str, Any]:
        """The plain fields the order depends on (fingerprinted; shown on a mismatch)."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.state_config())

    def seek_hints(self, consumed: int) -> dict[str, Any]:
        """What a loader's state adds at position ``consumed`` (default: nothing)."""
        return {}

    def apply_seek_hints(self, consumed: int, hints: Mapping[str, Any]) -> None:
        """Take the hints a loader's state saved at ``consumed`` (default: none)."""


class Resumable(Configured):
    """A reader that holds its own position: the one ``state_dict``/``load_state_dict``.

    A subclass sets ``state_kind`` and implements ``state_config``, ``_position`` (examples
    received so far, and the ``extra`` integers) and ``_seek`` (continue from a state
    already checked against this reader: kind, version, fingerprint)::

        class Rows(Resumable):
            state_kind = "rows"
            def state_config(self): return {"n": self.n, "seed": self.seed}
            def _position(self): return self.received, {}
            def _seek(self, state): self.received = state.consumed

    ``shardwise.testing.assert_resumes_exactly`` checks every reader against it.
    """

    state_kind: ClassVar[str]

    def _position(self) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def _seek(self, state: LoaderState) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where this reader is, as plain JSON (what was received, not prefetched)."""
        consumed, extra = self._position()
        return LoaderState(fingerprint=self.fingerprint, consumed=consumed,
                           config=self.state_config(), extra=extra,
                           kind=self.state_kind).to_dict()

    def load_state_dict(self, state: Any) -> None:
        """Continue exactly where ``state`` was saved; :class:`StateError` names what does
        not match (reader kind, data, configuration, position)."""
        st = LoaderState.from_dict(state)
        st.check_matches(self.state_kind, self.fingerprint, self.state_config())
        self._seek(st)
