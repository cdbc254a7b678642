"""Checkpoint state: a frozen, versioned record of *position*, with a JSON round trip.

A state says how many examples of the global order the consumer has *received* (never
what was prefetched), which configuration and data that order belongs to, and the version
of the order algorithm. It is the same on every rank, so any rank's saved state restores
any world size. Loading a state that does not match refuses loudly, naming each
difference; it never silently restarts from zero.

>>> s = LoaderState(fingerprint="9f2c", consumed=81_920, config={"seq_len": 2048})
>>> LoaderState.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

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


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [f"{k}: state has {saved.get(k)!r}, this reader has {current.get(k)!r}"
            for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]


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
        return cls(fingerprint=str(d["fingerprint"]), consumed=d["consumed"],
                   config=dict(d.get("config", {})), extra=dict(d.get("extra", {})),
                   kind=str(d["kind"]), version=version)

    def check_matches(self, kind: str, fingerprint: str, config: dict[str, Any]) -> None:
        """Raise :class:`StateError` naming every difference from the current reader."""
        if self.kind != kind:
            raise StateError(f"this state belongs to a {self.kind!r} reader, not {kind!r}")
        if self.fingerprint == fingerprint:
            return
        diffs = _differences(self.config, config) or [
            f"fingerprint: state has {self.fingerprint}, this reader has {fingerprint}"]
        raise StateError("refusing to resume: the state does not match this data and "
                         "configuration:\n  " + "\n  ".join(diffs) + "\nresume with the "
                         "configuration and cache the state was saved with")
