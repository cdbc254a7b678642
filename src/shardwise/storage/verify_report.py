"""What ``verify`` (and each chunk check) found: problems and notes, each naming its file.

A *problem* is damage (``verify`` exits 1); a *note* is something readers survive (a file
the ledger does not name, a ledger without a manifest checksum, a missing or stale
``ledger.index``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, order=True)
class Problem:
    """One finding: the file it is about and what is wrong with it."""

    path: str
    what: str


@dataclass
class VerifyReport:
    """What :func:`verify_cache` found. ``notes`` (orphans, temp files) never fail it."""

    root: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    chunks_checked: int = 0
    bytes_checked: int = 0
    quick: bool = False  # headers and sizes only (``verify --quick``)

    @property
    def ok(self) -> bool:
        return not self.problems

    def bad(self, path: Path | str, what: str) -> None:
        self.problems.append(Problem(str(path), what))

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "ok": self.ok, "quick": self.quick,
                "chunks_checked": self.chunks_checked, "bytes_checked": self.bytes_checked,
                "problems": [vars(p) for p in self.problems],
                "notes": [vars(p) for p in self.notes]}



def strip_advice(message: str, path: Path | str) -> str:
    """An error message without its leading ``<path>: `` (the report shows the path) and
    without advice to run verify (this is verify)."""
    head = f"{path}: "
    message = message[len(head):] if message.startswith(head) else message
    return message.split("; run 'shardwise verify", 1)[0]


def with_suffix(base: Path, suffix: str) -> Path:
    return base.with_name(base.name + suffix)
