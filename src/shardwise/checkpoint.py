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

from dataclasses import dataclass, field
from typing import Any

from shardwise.errors import StateError

STATE_VERSION = 1


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
        if not isinstance(self.consumed, int) or self.consumed < 0:
            raise StateError(f"consumed must be a non-negative integer, got {self.consumed!r}")

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
        if d["version"] != STATE_VERSION:
            raise StateError(f"state version {d['version']!r}; this shardwise reads version "
                             f"{STATE_VERSION}")
        return cls(fingerprint=str(d["fingerprint"]), consumed=d["consumed"],
                   config=dict(d.get("config", {})), extra=dict(d.get("extra", {})),
                   kind=str(d["kind"]), version=d["version"])

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
