"""``shardwise.build``: sources → a published, checksummed, resumable cache.

The coordinator (this process) owns the manifest and the ledger; workers publish chunk
files and report them; the coordinator names them in the ledger, which it replaces
atomically. Running the same build again continues from the ledger; running a different
one against an existing cache is refused with the fields that differ.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from shardwise._version import __version__
from shardwise.choice import Choice
from shardwise.concurrency.pool import WorkerCrashed
from shardwise.errors import CacheError, ConfigError, CrashRetried, RemoteError
from shardwise.format.chunk import ChunkKind
from shardwise.format.journal import Journal
from shardwise.format.ledger import ChunkEntry, Ledger
from shardwise.format.manifest import (
    Manifest,
    SourceInfo,
    TokenizerInfo,
)
from shardwise.format.megatron import token_dtype
from shardwise.sources.discovery import describe, discover
from shardwise.sources.on_error import OnError
from shardwise.sources.records import DEFAULT_MAX_RECORD_BYTES
from shardwise.storage.chunk_check import CheckDepth
from shardwise.storage.opening import open_store
from shardwise.storage.store import ChunkStore
from shardwise.writer.config import ChunkPolicy
from shardwise.writer.executor import LocalExecutor
from shardwise.writer.processors import (
    FunctionProcessor,
    Processor,
    TokenizerProcessor,
    switched_off_notes,
)
from shardwise.writer.progress import BuildSummary, ProgressReporter
from shardwise.writer.repair import repair_tasks
from shardwise.writer.start import Check, start_ledger
from shardwise.writer.worker import ChunkDone, ChunksRebuilt, Job, Progress, SegmentDone, Task

if TYPE_CHECKING:
    from tokenizers import Tokenizer

LEDGER_SAVE_INTERVAL = 0.25
LEDGER_SHARE = 0.02
"""A build saves its progress (a journal record) at most every 0.25 s, and only while
its saves so far took at most 2 % of its time: where a save is slow (a loaded disk's
fsync, a far store's PUT) records come further apart instead of slowing the build."""


def _make_processor(tokenizer: str | os.PathLike[str] | Tokenizer | None,
                    processor: Callable[[dict[str, Any]], Any] | Processor | None, *,
                    text_key: str,
                    append_eod: bool, eod_token: str | None, vocab_size: int | None,
                    records: bool, processor_version: str | None) -> Processor:
    if (tokenizer is None) == (processor is None):
        raise ConfigError("give exactly one of tokenizer= (a tokenizer.json) or processor= "
                          "(a function record -> token ids)")
    if hasattr(processor, "process") and hasattr(processor, "settings"):
        if getattr(processor, "records", False) and not records:
            raise ConfigError(f"{type(processor).__name__} makes dicts (input_ids, labels, "
                              "loss_mask): build with records=True")
        return processor  # type: ignore[return-value]  # e.g. ChatProcessor
    if tokenizer is not None:
        if records:
            raise ConfigError("records=True needs processor=: a tokenizer makes token chunks")
        return TokenizerProcessor.from_file(tokenizer, text_key=text_key, append_eod=append_eod,
                                            eod_token=eod_token)
    if vocab_size is None:
        raise ConfigError("processor= needs vocab_size= (it sets the token dtype)")
    assert processor is not None  # for mypy: checked above
    return FunctionProcessor(processor, vocab_size, version=processor_version, records=records)


def _ordered_tasks(ledger: Ledger, infos: list[Any]) -> list[Task]:
    """Unfinished segments, round robin over sources, so early global chunks come first."""
    tasks: list[tuple[int, int, Task]] = []
    for s, (src, info) in enumerate(zip(ledger.sources, infos, strict=True)):
        for g, seg in enumerate(src.segments):
            if not seg.finished:
                tasks.append((g, s, Task(s, info, g, seg)))
    return [t for _, _, t in sorted(tasks, key=lambda x: (x[0], x[1]))]


# times the unfinished work of a local worker that crashed (a native crash signal) runs again
CRASH_RETRIES = 1


class ExecutorKind(Choice):
    """Where build tasks run: local processes, or a Ray cluster (or an executor object)."""

    __option__ = "executor"
    LOCAL = "local"
    RAY = "ray"


class Executor(Protocol):
    """Runs tasks, calling ``on_message`` in the caller's thread (see LocalExecutor.run)."""

    def run(self, job: Job, tasks: Iterable[Task], on_message: Callable[[object], None]
            ) -> None: ...


def _make_executor(executor: str | ExecutorKind | Executor | None, workers: int | None,
                   address: str | None) -> tuple[Executor, Callable[[], None]]:
    """The executor to run on, and how to release it: build() closes only what it made."""
    if executor is not None and not isinstance(executor, str):
        if address is not None:
            raise ConfigError("address= is for executor='ray'; with an executor object, give "
                              "the address to it: RayExecutor(address=...)")
        return executor, lambda: None
    kind = ExecutorKind.parse(executor or ExecutorKind.LOCAL)
    if kind is ExecutorKind.RAY:
        from shardwise.writer.ray_executor import RayExecutor

        ray_ex = RayExecutor(workers, address=address)
        return ray_ex, ray_ex.close
    if address is not None:
        raise ConfigError(f"address={address!r} needs executor='ray' (--executor ray)")
    local = LocalExecutor(workers)
    return local, local.close


class _Coordinator:
    """Applies worker messages to the ledger and saves what changed as a journal record
    (at most every 0.25 s, within :data:`LEDGER_SHARE` of the run's time; the whole ledger
    only when the journal is compacted: :mod:`shardwise.format.journal`)."""

    def __init__(self, root: ChunkStore, ledger: Ledger, reporter: ProgressReporter,
                 infos: list[SourceInfo]) -> None:
        self.root, self.ledger, self.reporter, self.infos = root, ledger, reporter, infos
        self.journal = Journal(root, ledger)
        self.dirty = False
        self.started = self.saved_at = time.monotonic()
        self.saved_at = 0.0
        self.new_chunks = 0
        self.rebuilt: set[str] = set()  # stems republished by repair tasks
        self.stems: dict[tuple[int, int], dict[str, ChunkEntry]] = {}  # see _known

    def __call__(self, msg: object) -> None:
        if isinstance(msg, Progress):
            self.reporter.advance(0.0, msg.documents, msg.tokens, msg.bytes_read)
            return
        if isinstance(msg, ChunksRebuilt):
            self.reporter.advance(1.0)
            return
        if isinstance(msg, ChunkDone):
            seg = self.ledger.sources[msg.source].segments[msg.seg_index]
            known = self._known(msg.source, msg.seg_index)
            if msg.entry.stem in known:  # a repair, or a retried task reporting it again
                self._check_same(known[msg.entry.stem], msg)
                self.rebuilt.add(msg.entry.stem)
                return
            seg.chunks.append(msg.entry)
            known[msg.entry.stem] = msg.entry
            seg.position, seg.line, seg.errors = msg.position, msg.line, msg.errors
            self.journal.touch(msg.source, msg.seg_index)
            self.new_chunks += 1
        elif isinstance(msg, SegmentDone):
            seg = self.ledger.sources[msg.source].segments[msg.seg_index]
            if seg.stop < 0:
                seg.stop = msg.position
            seg.position, seg.line, seg.errors = msg.position, msg.line, msg.errors
            seg.finished = True
            self.journal.touch(msg.source, msg.seg_index)
            self.reporter.advance(1.0)
        self.dirty = True
        self.save(force=False)

    def _known(self, source: int, segment: int) -> dict[str, ChunkEntry]:
        """The segment's chunks by stem, kept as they are reported (made once per
        segment: a dict made again per chunk cost O(chunks²) — minutes at 100,000)."""
        key = (source, segment)
        if key not in self.stems:
            chunks = self.ledger.sources[source].segments[segment].chunks
            self.stems[key] = {c.stem: c for c in chunks}
        return self.stems[key]

    def _check_same(self, recorded: ChunkEntry, msg: ChunkDone) -> None:
        """A chunk made again must be the one the ledger names: its ``.json`` (which holds
        every data file's size and xxh3) must hash the same."""
        if recorded != msg.entry:
            differ = ", ".join(f"{k} {getattr(msg.entry, k)!r}, the ledger says "
                               f"{getattr(recorded, k)!r}" for k in vars(recorded)
                               if getattr(recorded, k) != getattr(msg.entry, k))
            raise CacheError(f"{self.root.name(msg.entry.stem)}: made again with different "
                             f"bytes ({differ}): the source {self.infos[msg.source].shown} "
                             "changed since this cache was built; start again with "
                             "overwrite=True (--overwrite), or build into a new directory")

    def save(self, force: bool) -> None:
        """A journal record at most every 0.25 s, while the saves took at most
        :data:`LEDGER_SHARE` of the time since the start; ``force`` (the end of a run, whatever
        ended it): the whole ledger, compacted."""
        now = time.monotonic()
        if force:
            self.journal.compact()
            self.saved_at, self.dirty = now, False
        elif self.dirty and now - self.saved_at >= LEDGER_SAVE_INTERVAL \
                and self.journal.seconds <= LEDGER_SHARE * (now - self.started):
            self.journal.save()
            self.saved_at, self.dirty = now, False


def build(sources: Sequence[str | os.PathLike[str] | Any] | Any, out: str | os.PathLike[str], *,
          tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
          processor: Callable[[dict[str, Any]], Any] | Processor | None = None,
          vocab_size: int | None = None, text_key: str = "text", workers: int | None = None,
          chunk_docs: int | None = None, chunk_mb: float | None = None,
          append_eod: bool = False, eod_token: str | None = None,
          on_error: str | OnError = OnError.RAISE, records: bool = False,
          segment_bytes: int | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
          processor_version: str | None = None, overwrite: bool = False,
          progress: bool | None = None, executor: str | ExecutorKind | Executor | None = None,
          address: str | None = None, storage_options: dict[str, Any] | None = None,
          verify: bool = True) -> BuildSummary:
    """Tokenize ``sources`` (paths, globs, Hugging Face folders, ``datasets.Dataset``:
    :func:`~shardwise.sources.discovery.discover`) into ``out``; resume it if it exists.

    ``text_key="meta.body"``: a nested field. ``tokenizer``: a tokenizer.json path or a
    ``tokenizers.Tokenizer`` (truncation and padding switched off; the summary notes it).
    ``executor``: ``"local"`` (processes here, the default), ``"ray"`` (the Ray cluster at
    ``address``, or a local Ray: :mod:`shardwise.writer.ray_executor`), or an executor
    object, which the caller closes. ``sources`` and ``out`` may be URLs (``s3://b/raw/*.zst``,
    ``s3://b/cache``; anything fsspec speaks): sources are read by ranged GETs
    (:mod:`shardwise.sources.bucket`), chunks uploaded whole before the ledger names them
    (:mod:`shardwise.remote.client`); credentials come from the environment or
    ``storage_options`` (never stored). No lock on a store: one build per URL at a time.

    A rerun first checks every chunk an earlier run published (size and xxh3; ``verify=False``:
    sizes only) and rebuilds the damaged ones, byte-identical (:mod:`.repair`).

    >>> build(["data/*.jsonl.zst"], "cache/", tokenizer="tokenizer.json")  # doctest: +SKIP
    """
    started = time.monotonic()
    err_mode = OnError.parse(on_error)
    policy = ChunkPolicy.from_options(chunk_docs=chunk_docs, chunk_mb=chunk_mb,
                                      segment_bytes=segment_bytes)
    proc = _make_processor(tokenizer, processor, text_key=text_key, append_eod=append_eod,
                           eod_token=eod_token, vocab_size=vocab_size, records=records,
                           processor_version=processor_version)
    runner, release = _make_executor(executor, workers, address)
    found = describe(discover(sources, storage_options), storage_options)
    manifest = _manifest(proc, policy, found, err_mode, records)
    root = open_store(out, storage_options)
    depth = CheckDepth.CHECKSUMS if verify else CheckDepth.SIZES
    with root.locked():
        ledger, check = start_ledger(root, manifest, policy, overwrite, depth, storage_options)
        job = Job(root.location, proc, policy, err_mode, manifest.dtype,
                  manifest.tokenizer.vocab_size, records, max_record_bytes, storage_options)
        coordinator = _run(root, runner, release, job, ledger, check, found, progress)
        return _summary(root, ledger, check, coordinator, time.monotonic() - started,
                        notes=switched_off_notes(getattr(proc, "switched_off", {})))


def _manifest(proc: Processor, policy: ChunkPolicy, infos: list[SourceInfo],
              err_mode: OnError, records: bool) -> Manifest:
    """What this build is: the identity a rerun must match (see format/SPEC.md)."""
    vocab = proc.vocab_size()  # type: ignore[attr-defined]
    return Manifest(
        tokenizer=TokenizerInfo(proc.fingerprint(), vocab,  # type: ignore[attr-defined]
                                getattr(proc, "eod_id", None)),
        dtype=token_dtype(vocab).name,
        chunk_kind=(ChunkKind.RECORDS if records else ChunkKind.TOKENS).value,
        processor=proc.settings(),
        chunking={"max_docs": policy.max_docs, "max_bytes": policy.max_bytes,
                  "segment_bytes": policy.segment_bytes},
        sources=[replace(i, path=i.shown) for i in infos],  # read by `found`'s full paths
        on_error=err_mode.value, created_by=f"shardwise {__version__}")


def _run(root: ChunkStore, runner: Executor, release: Callable[[], None], job: Job, ledger: Ledger,
         check: Check, infos: list[SourceInfo], progress: bool | None) -> _Coordinator:
    """Run the repair tasks, then the unfinished segments; the ledger is saved as chunks
    are reported and once more at the end, whatever happens (:func:`_finish`)."""
    tasks = repair_tasks(root, ledger, infos, check.damaged) + _ordered_tasks(ledger, infos)
    reporter = ProgressReporter(sum(len(s.segments) for s in ledger.sources)
                                + sum(t.rebuild > 0 for t in tasks), enabled=progress)
    reporter.advance(sum(seg.finished for s in ledger.sources for seg in s.segments))
    coordinator = _Coordinator(root, ledger, reporter, infos)

    def rest() -> list[Task]:  # what a crashed worker left: as a rerun would plan it
        damaged = [d for d in check.damaged if d.stem not in coordinator.rebuilt]
        return repair_tasks(root, ledger, infos, damaged) + _ordered_tasks(ledger, infos)

    try:
        _run_tasks(runner, job, tasks, rest, coordinator)
    except BaseException as e:
        _finish(release, coordinator, failed=e)
        raise
    _finish(release, coordinator, failed=None)
    return coordinator


def _run_tasks(runner: Executor, job: Job, tasks: list[Task], rest: Callable[[], list[Task]],
               coordinator: _Coordinator) -> None:
    """Run ``tasks``; where a local worker crashed in native code (SIGSEGV, SIGBUS...: not
    a kill, not an error it reported), warn with the stack it crashed on and run what is
    left (``rest()``, planned from the ledger as a rerun would: the same bytes), up to
    :data:`CRASH_RETRIES` times. A crash of a process forked from a busy multi-threaded one
    (a test runner, a notebook) can be a matter of luck; one that repeats is raised."""
    for retry in range(CRASH_RETRIES + 1):
        try:
            runner.run(job, tasks if retry == 0 else rest(), coordinator)
            return
        except WorkerCrashed as e:
            if not e.crashed or retry == CRASH_RETRIES:
                raise
            warnings.warn(f"{e}\nits unfinished work runs again from the ledger (retry "
                          f"{retry + 1} of {CRASH_RETRIES})", CrashRetried, stacklevel=2)


def _finish(release: Callable[[], None], coordinator: _Coordinator,
            failed: BaseException | None) -> None:
    """Release the executor and save the whole ledger — but not after a RemoteError
    (``failed``): the store may have stopped answering, and the save would wait out the
    policy's bound a second time; the records already saved keep the cache resumable (a
    rerun makes the last 0.25 s of chunks again, the same bytes). A failed last save
    after another error is noted on that error, which stays raised."""
    try:
        release()
        if isinstance(failed, RemoteError):
            return
        coordinator.save(force=True)
    except Exception as e:
        if failed is None:
            raise
        failed.add_note(f"(the ledger's last save failed too: {type(e).__name__}: {e})")
    finally:
        coordinator.reporter.close()


def _summary(root: ChunkStore, ledger: Ledger, check: Check, coordinator: _Coordinator,
             seconds: float, notes: list[str]) -> BuildSummary:
    missing = sorted({d.stem for d in check.damaged} - coordinator.rebuilt)
    if missing:  # every repair task republishes its chunks or raises: this is a bug
        raise CacheError(f"{root.location}: damaged chunks {missing[:5]} were not rebuilt")
    order = ledger.global_order()
    return BuildSummary(
        root=root.location, sources=len(ledger.sources), chunks=len(order),
        documents=sum(c.documents for _, c in order),
        tokens=sum(c.tokens for _, c in order),
        bytes_read=coordinator.reporter.bytes_read, seconds=seconds, errors=ledger.errors(),
        resumed_chunks=check.checked - len(check.damaged), new_chunks=coordinator.new_chunks,
        checked_chunks=check.checked,
        check_depth=check.depth.name.lower() if check.depth is not None else "",
        check_seconds=check.seconds,
        rebuilt_chunks={d.stem: d.reason(root) for d in check.damaged},
        empty_documents=sum(c.empty for _, c in order), notes=notes,
        ledger_seconds=coordinator.journal.seconds, ledger_records=coordinator.journal.records,
        ledger_snapshots=coordinator.journal.snapshots)


__all__ = ["build"]
