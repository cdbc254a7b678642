"""What keeps damaged bytes from reaching a model: the readers' checks, cheapest first.

1. **Structure, when a chunk is opened** (:class:`~shardwise.storage.store.ChunkStore`): every
   file resolves inside the cache; the ``.bin`` holds exactly the ledger's tokens; the
   ``.idx`` agrees with the ``.bin`` and the ledger
   (:func:`~shardwise.format.megatron.check_index`). Once per chunk per process.
2. **Token ids, per batch** (:func:`~shardwise.format.megatron.first_bad_id`): one
   vectorised reduction over the batch's ids, which must lie in ``[0, vocab_size)``; an
   id outside is a :class:`CorruptChunkError` naming the chunk file and the id.
3. **Checksums, once per node.** Where a chunk is read whole anyway (stream placement)
   its bytes are hashed in memory before use; a download from an object store is hashed
   as it streams. Where reads are random (global placement) a :class:`ChunkVerifier`
   (:mod:`shardwise.storage.verifier`) hashes each chunk file a process opens, and checks
   all its ids against the vocabulary, on the cache's background thread, while batches
   are served; the first damage it finds is raised by the next batch::

       batch 7 opens chunk 3 ─▶ served (its ids were in range)   verifier: hashing chunk 3
       batch 8               ─▶ CorruptChunkError: chunk 3's .bin xxh3_64 …, the metadata says …

   Verified files are appended to a :class:`VerifiedLog`, so the node's other processes
   (ranks, DataLoader workers) and later runs skip them. Once every chunk a process has
   opened is verified (ids included), the per-batch id check of 2 has nothing left to
   find and is skipped (:meth:`CacheChecks.batch_ids`): a long run pays for it only
   while its chunks are first read.

``open_cache(..., verify=False)`` (``--no-verify``) turns off 2 and 3 for a trusted cache.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import ChunkMeta
from shardwise.format.ledger import ChunkEntry
from shardwise.format.megatron import MegatronIndex, check_index, first_bad_id
from shardwise.format.paths import READER_DIR, user_cache_dir
from shardwise.storage.chunk_check import ChunkExpect, check_chunk
from shardwise.storage.chunk_table import ChunkInfo, View
from shardwise.storage.runs import Runs
from shardwise.storage.verifier import ChunkVerifier, VerifiedLog


class Store(Protocol):
    """What the checks need of a :class:`~shardwise.storage.store.ChunkStore`."""

    checks_in_background: ClassVar[bool]  # False: its files are checked as they arrive

    @property
    def root(self) -> Path: ...

    def name(self, relative: str) -> str: ...
    def meta_of(self, info: ChunkInfo) -> ChunkMeta: ...
    def bin_size(self, info: ChunkInfo) -> int: ...
    def submit(self, job: Callable[[], None]) -> Future[None]: ...


class CacheChecks:
    """The checks of one open cache (see the module doc), over its ``store`` and the
    ledger's ``view``: the store calls :meth:`index` and :meth:`opened` as it opens chunk
    files, readers call :meth:`ids` per batch (and :meth:`loaded` for a chunk read
    whole). ``verify`` False keeps only the structural checks."""

    def __init__(self, store: Store, view: View, *, background: bool = True) -> None:
        self.store, self.view, self.verify = store, view, view.verify
        self.vocab_size = view.vocab_size if view.verify else None
        # None: no id to check (not verifying, no vocabulary, or the dtype cannot hold an
        # id beyond it); ids are read from this dtype, so no wider copy can either
        self._limit = self.vocab_size
        if self._limit is not None and first_bad_id(
                np.full(1, np.iinfo(view.dtype).max, view.dtype), self._limit) < 0:
            self._limit = None
        self.verifier: ChunkVerifier | None = None
        if (background and view.verify and not view.is_megatron
                and store.checks_in_background):
            self.log = VerifiedLog([(store.root, READER_DIR), (user_cache_dir(), "")],
                                   view.fingerprint)
            self.verifier = ChunkVerifier(self._verify_files, store.submit)

    def _name(self, c: int, suffix: str) -> str:
        return self.store.name(self.view.chunks[c].stem + suffix)

    def _advice(self) -> str:
        return f"run 'shardwise verify {self.view.location}'"

    def index(self, c: int, idx: MegatronIndex) -> None:
        """Chunk ``c``'s ``.idx`` against its ``.bin`` (its size from the metadata on an
        object store, where the ``.bin`` may not be here yet) and against the ledger: an
        edited length must not shift document boundaries unannounced."""
        view, info = self.view, self.view.chunks[c]
        bin_name = self._name(c, ".bin")
        try:
            size = self.store.bin_size(info)
        except FileNotFoundError:
            raise CorruptChunkError(f"{bin_name}: named by the ledger but missing; "
                                    f"{self._advice()}") from None
        check_index(idx, bin_name, size)
        # a Megatron prefix's documents may hold several sequences each
        docs = idx.num_documents if view.is_megatron else idx.num_sequences
        got = (docs, idx.num_tokens, idx.dtype)
        want = (info.documents, info.tokens, view.dtype)
        if got != want:
            raise CorruptChunkError(f"{idx.path}: holds {got[0]} documents, {got[1]} tokens "
                                    f"of {got[2]}; the ledger says {want[0]}, {want[1]} of "
                                    f"{want[2]}; {self._advice()}")

    def opened(self, c: int, suffixes: tuple[str, ...]) -> None:
        """Chunk ``c``'s files ``suffixes`` are in use: verify them in the background."""
        if self.verifier is not None:
            self.verifier.want(c, suffixes)

    def batch_ids(self, ids: npt.NDArray[Any], runs: Runs) -> None:
        """:meth:`ids` for a batch gathered from ``runs`` of memory-mapped chunks
        (:meth:`Cache.tokens`), skipped once every chunk this process opened is verified:
        the background check has then seen every id such a batch can hold. (The runs, not
        a function of them: nothing is made per batch for the bad id that is not there.)"""
        if self._limit is None or (self.verifier is not None and self.verifier.settled):
            return  # no vocabulary to check against, or every id already checked
        self.ids(ids, runs.stream_offset(self.view.cum_tokens))

    def ids(self, ids: npt.NDArray[Any], offset_of: Callable[[int], int]) -> None:
        """Refuse ids outside ``[0, vocab_size)`` (one vectorised check per batch);
        ``offset_of(k)``: the stream offset of flat element ``k``, to name its chunk."""
        if self._limit is None:
            return
        k = first_bad_id(ids, self._limit)
        if k < 0:
            return
        cum, offset = self.view.cum_tokens, offset_of(k)
        c = int(np.searchsorted(cum, offset, side="right")) - 1
        raise CorruptChunkError(
            f"{self._name(c, '.bin')}: token id {int(ids.reshape(-1)[k])} at token "
            f"{offset - int(cum[c])} of the chunk, outside the vocabulary of "
            f"{self.vocab_size} ids (the manifest's vocab_size): damaged bytes, or a cache "
            f"built with another tokenizer; {self._advice()}")

    def loaded(self, c: int, tokens: npt.NDArray[np.generic]) -> None:
        """Chunk ``c``'s tokens, read whole into memory: their checksum, before any use,
        then their ids."""
        if not self.verify:
            return
        if not self.view.is_megatron:
            want = self.store.meta_of(self.view.chunks[c]).files.get(".bin", {}).get("xxh3_64")
            got = bytes_checksum(tokens.data.cast("B") if tokens.nbytes else b"")
            if got != want:
                raise CorruptChunkError(f"{self._name(c, '.bin')}: xxh3_64 {got}, the "
                                        f"metadata says {want}; {self._advice()}")
        base = int(self.view.cum_tokens[c])
        self.ids(tokens, lambda k: base + k)

    def stats(self) -> dict[str, int]:
        if self.verifier is None:
            return {"hashed": 0, "skipped": 0, "queued": 0}
        return self.verifier.stats()

    def _verify_files(self, c: int, suffixes: tuple[str, ...]) -> tuple[bool, str | None]:
        """On the background thread: chunk ``c``'s files ``suffixes`` against their
        checksums (:func:`~shardwise.storage.chunk_check.check_chunk`), unless this node's log
        lists them unchanged. Returns (whether data was hashed, the problem or None)."""
        view, info = self.view, self.view.chunks[c]
        files = self.store.meta_of(info).files
        keys: dict[str, str] = {}
        for suffix in suffixes:
            with contextlib.suppress(OSError, KeyError):  # check_chunk names the problem
                st = os.stat(info.base.with_name(info.base.name + suffix))
                keys[suffix] = VerifiedLog.key(info.stem + suffix, files[suffix]["xxh3_64"],
                                               st, self.vocab_size)
        todo = [s for s in suffixes if s not in keys or keys[s] not in self.log]
        if not todo:
            return False, None
        entry = ChunkEntry(info.stem, info.documents, info.tokens, info.meta_xxh3)
        report = check_chunk(ChunkExpect(self.store.root, info.source, entry, info.kind,
                                         view.dtype, vocab_size=self.vocab_size),
                             suffixes=todo)
        if not report.ok:
            found = "; ".join(f"{p.path}: {p.what}" for p in report.problems)
            return True, (f"{found} (found by the background checksum verification of the "
                          "chunks this process reads; batches before this one may have "
                          f"held these bytes); {self._advice()}")
        for s in todo:
            if s in keys:
                self.log.add(keys[s])
        return True, None
