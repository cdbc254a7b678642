"""Processing records (parse + ``map_fn``) inline or in worker processes.

:class:`Processor` turns a batch of raw records into outcomes: the example, or a
:class:`Dropped` with a reason (and, for bad input, the :class:`InputError` that names file
and line). :class:`Keyed` is its work in the one process pool
(:class:`shardwise.concurrency.pool.ProcessPool`: forked on Linux, spawned elsewhere, then
``map_fn`` must be picklable); results come back keyed so the caller restores its order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from shardwise.errors import InputError
from shardwise.read.records.ranges import Payload
from shardwise.sources.records import DEFAULT_MAX_RECORD_BYTES, parse_line


@dataclass(frozen=True)
class Reject:
    """Return ``Reject("too_long")`` from ``map_fn`` to drop a record under that reason
    (returning None drops it as ``rejected``)."""

    reason: str = "rejected"


@dataclass(frozen=True)
class Dropped:
    """A record that yields no example: the reason, and the error for bad input."""

    reason: str
    error: InputError | None = None


@dataclass(frozen=True)
class Packed:
    """Raw JSONL lines as one newline-joined blob: cheap to send to a worker (lines never
    hold a newline), instead of one pickled object per line."""

    blob: bytes
    files: list[int]
    lines: list[int]

    def unpack(self) -> Iterator[tuple[Payload, int, int]]:
        return zip(self.blob.split(b"\n"), self.files, self.lines, strict=True)


@dataclass(frozen=True)
class Processor:
    """Parse (JSON, or UTF-8 text with ``text_mode``) and apply ``map_fn``.

    Items are ``(payload, file, line)``: ``file`` indexes ``paths``, ``line`` is 1-based
    within the range (the caller rewrites it to the file's line when it raises)."""

    map_fn: Callable[[Any], Any] | None
    text_mode: bool
    paths: tuple[str, ...]

    def __call__(self, items: Sequence[tuple[Payload, int, int]] | Packed) -> list[Any]:
        paths = self.paths
        if isinstance(items, Packed):
            return [self.one(p, paths[f], line) for p, f, line in items.unpack()]
        return [self.one(p, paths[f], line) for p, f, line in items]

    def one(self, payload: Payload, path: str, line: int) -> Any:
        if isinstance(payload, InputError):
            return Dropped(payload.reason, payload)
        record: Any = payload
        if isinstance(payload, bytes):
            record = _decode(payload, path, line) if self.text_mode else _loads(payload)
            if record is None:  # not a plain JSON object: parse_line says why
                record = parse_line(payload, path=path, line_for_error=line)
            if isinstance(record, InputError):
                return Dropped(record.reason, record)
        if self.map_fn is None:
            return record
        try:
            out = self.map_fn(record)
        except Exception as e:  # the user's function: reported with file and line
            return Dropped("map_error", InputError(
                f"{path}:{line}: map_fn raised {type(e).__name__}: {e}", path=path, line=line,
                reason="map_error"))
        if out is None:
            return Dropped("rejected")
        if isinstance(out, Reject):
            return Dropped(out.reason)
        return out


def _loads(raw: bytes) -> dict[str, Any] | None:
    """The fast path of :func:`parse_line`: a JSON object, else None (then parse_line
    finds and names the problem)."""
    if len(raw) > DEFAULT_MAX_RECORD_BYTES:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is dict else None


def _decode(raw: bytes, path: str, line: int) -> str | InputError:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if not raw.strip():
        return InputError(f"{path}:{line}: empty line", path=path, line=line,
                          reason="empty_line")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as u:
        return InputError(f"{path}:{line}: undecodable bytes (not UTF-8) at column "
                          f"{u.start + 1}", path=path, line=line, reason="undecodable")


@dataclass(frozen=True)
class Keyed:
    """The pool's work for :class:`Processor`: ``(key, items)`` in, ``(key, outcomes)`` out,
    so the caller restores its order."""

    fn: Callable[[Any], Any]

    def __call__(self, task: tuple[Any, Any], put: Callable[[Any], None]) -> None:
        key, items = task
        put((key, self.fn(items)))
