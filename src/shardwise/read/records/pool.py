"""Processing records (parse + ``map_fn``) inline or in worker processes.

:class:`Processor` turns a batch of raw records into outcomes: the example, or a
:class:`Dropped` with a reason (and, for bad input, the :class:`InputError` that names file
and line). :class:`ProcessPool` runs it in ``workers`` local processes, the pattern of
:mod:`shardwise.writer.executor`: forked on Linux (spawned elsewhere, then ``map_fn`` must
be picklable), one task queue, one result queue, results keyed so the caller restores
its order; a worker dies with its parent (``PR_SET_PDEATHSIG`` on Linux, a parent-pid
check elsewhere). No shared memory, no lock files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from shardwise.errors import ConfigError, InputError, ShardwiseError
from shardwise.read.records.ranges import Payload
from shardwise.sources.records import DEFAULT_MAX_RECORD_BYTES, parse_line

_POLL_SECONDS = 0.2


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


class WorkerCrashed(ShardwiseError):
    """A processing worker died without reporting (killed, out of memory, segfault)."""


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


class _Failure:
    def __init__(self, error: BaseException, tb: str) -> None:
        self.error, self.tb = error, tb


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass


def _worker_main(fn: Callable[[Any], Any], tasks: Any, results: Any, parent: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    _die_with_parent()
    while True:
        msg = tasks.get()
        if msg is None or os.getppid() != parent:
            return
        key, items = msg
        try:
            results.put((key, fn(items)))
        except BaseException as e:  # reported, then this worker stops
            results.put((key, _Failure(e, traceback.format_exc())))
            return


class ProcessPool:
    """``fn`` over task batches in ``workers`` processes; results come back keyed."""

    def __init__(self, fn: Callable[[Any], Any], workers: int,
                 start_method: str | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        self._owner = os.getpid()
        method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
        ctx: Any = mp.get_context(method)
        self._tasks, self._results = ctx.Queue(), ctx.Queue()
        self._procs = [ctx.Process(target=_worker_main, daemon=True,
                                   args=(fn, self._tasks, self._results, os.getpid()),
                                   name=f"shardwise-records-{i}") for i in range(workers)]
        for p in self._procs:
            p.start()

    def submit(self, key: Any, items: Any) -> None:
        self._tasks.put((key, items))

    def get(self) -> tuple[Any, Any]:
        """The next finished task ``(key, outcomes)``; raises a worker's error."""
        while True:
            try:
                key, out = self._results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead and self._results.empty():
                    raise WorkerCrashed(f"record worker {dead[0].name} died with exit code "
                                        f"{dead[0].exitcode} (killed or out of memory)"
                                        ) from None
                continue
            if isinstance(out, _Failure):
                raise out.error
            return key, out

    def close(self) -> None:
        if os.getpid() != self._owner:  # a forked copy (a DataLoader worker): not ours
            return
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        self._procs = []
        self._tasks.close()
        self._results.close()
        self._tasks.cancel_join_thread()
        self._results.cancel_join_thread()
