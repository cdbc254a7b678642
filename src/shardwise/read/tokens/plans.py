"""Document-shuffle plans and document starts, built once per node and memory-mapped.

Both are O(documents) to build and identical for every rank of a node, so one process
builds each (whoever takes its lock in the plan directory first, by
:func:`~shardwise.concurrency.once.build_once`) while the others wait by the one poller and
map what it published; a builder that dies releases its lock with its last descriptor and
the next waiter builds instead. A damaged file is refused (ValueError naming it) and
rebuilt under the lock, never used. The plan's pure parts live in
:mod:`shardwise.plan.doc_shuffle`.

A document shuffle needs two arrays of the stored stream: each document's start (to read
its tokens) and its length (to plan the order). Both come from the chunks' ``.idx`` files,
which at 100M documents means a pass over gigabytes of index, so the starts are written
once per node as ``<key>.doc_starts.npy`` (``n_docs + 1`` int64 values, the last one the
total) under the plan directory, by one process while the others wait
(:func:`~shardwise.concurrency.once.build_once`), streamed chunk by chunk in blocks so the
builder holds O(block) of them. Lengths are read back from that file in blocks (plain
reads, not a map: a builder's peak memory is the int32 lengths, not the file too)::

    doc lengths (stored)  3 5 2        doc_starts  [0, 3, 8, 10]
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib import format as npy

from shardwise.concurrency.local import ProcessLocal
from shardwise.concurrency.once import build_once
from shardwise.errors import CorruptChunkError
from shardwise.format.atomic import TMP_PREFIX, atomic_write_bytes, npy_blocks
from shardwise.format.checksum import map_checked_npy
from shardwise.format.confined import LOCK, open_regular, open_under, read_regular
from shardwise.format.megatron import HEADER_SIZE, read_idx
from shardwise.format.paths import reader_dir
from shardwise.plan.doc_shuffle import BLOCK as PLAN_BLOCK
from shardwise.plan.doc_shuffle import (
    DOC_SHUFFLE_VERSION,
    DocShuffleIndex,
    check_order,
    plan_fingerprint,
    write_doc_shuffle,
)
from shardwise.storage.cache_range import DocumentRange
from shardwise.storage.verifier import VerifiedLog

BLOCK = 1 << 20
_INT32_MAX = np.iinfo(np.int32).max


def starts_path(cache: Any, plan_root: Path) -> Path:
    """The file of ``cache``'s document starts under ``plan_root`` (keyed by its identity)."""
    key = plan_fingerprint({"doc_starts": cache.fingerprint, "tokens": cache.num_tokens,
                            "chunks": len(cache.chunks)})
    return plan_root / f"{key}.doc_starts.npy"


def _sidecar(path: Path) -> Path:
    """``<key>.doc_starts.json``: the starts file's xxh3-64, published after it."""
    return path.with_suffix(".json")


def checked_here(plan_root: Path) -> VerifiedLog:
    """The node's record of the plan files checked against their checksums, in
    ``plan_root/verified/plans.<host>.log`` (the verified-chunks log's machinery: no
    symlink followed; an entry names the file's inode and mtime, so a file replaced since
    is hashed again): each file is hashed once per node, not once per process."""
    return VerifiedLog([(plan_root, "")], "plans")


def _load(path: Path, n_docs: int, total: int) -> npt.NDArray[np.int64] | None:
    """The published starts, memory-mapped once their checksum matches; ``None`` if
    absent; ValueError if damaged."""
    sidecar = _sidecar(path)
    if not sidecar.exists():
        return None
    fix = f"delete {path} to rebuild it"
    try:
        xxh3 = str(json.loads(read_regular(sidecar))["xxh3_64"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{sidecar}: unreadable ({exc!r}); {fix}") from exc
    arr = map_checked_npy(path, xxh3, fix, checked_here(path.parent))
    if arr.dtype != np.int64 or arr.shape != (n_docs + 1,) or arr[0] != 0 or arr[-1] != total:
        raise ValueError(f"{path}: expected int64 of shape ({n_docs + 1},) from 0 to {total}, "
                         f"got {arr.dtype} {arr.shape}; {fix}")
    return arr  # type: ignore[no-any-return]


def _chunk_lengths(cache: Any, c: int, block: int) -> Iterator[npt.NDArray[np.integer]]:
    """Chunk ``c``'s document lengths in blocks of ``block``, checked against the cache's
    counts. Plain reads of the ``.idx``'s lengths section, not its memory map: a map would
    keep every page read (2 GB of index at 100M documents) in the builder's RSS. A
    document of several sequences (``--split-sentences``) takes the mapped, summed path."""
    info = cache.chunks[c]
    if isinstance(cache, DocumentRange):  # its chunks are pieces of the parent's files
        lengths = cache.doc_lengths(c)
        yield from (lengths[a: a + block] for a in range(0, len(lengths), block))
        return
    idx = cache.with_chunk_file(c, ".idx", read_idx)  # header checked; arrays not read
    if idx.num_documents != info.documents:
        raise CorruptChunkError(f"{idx.path}: {idx.num_documents} documents, the cache says "
                                f"{info.documents}; run 'shardwise verify {cache.location}'")
    if idx.num_documents != idx.num_sequences:
        lengths = cache.doc_lengths(c)
        yield from (lengths[a: a + block] for a in range(0, len(lengths), block))
        return
    n = idx.num_sequences
    with open(idx.path, "rb") as f:
        f.seek(HEADER_SIZE)
        for a in range(0, n, block):
            yield np.fromfile(f, dtype=np.int32, count=min(block, n - a))


def _build(cache: Any, path: Path, block: int) -> None:
    """Stream every chunk's document lengths, as running sums, into ``path``; a chunk whose
    lengths do not add up to its tokens is refused (its documents would be misplaced)."""
    _sidecar(path).unlink(missing_ok=True)  # unpublished while rebuilt
    for stale in path.parent.glob(f"{TMP_PREFIX}{path.name}.*"):  # a dead builder's
        stale.unlink(missing_ok=True)
    with npy_blocks(path, np.int64, cache.num_documents + 1) as put:
        put(np.zeros(1, dtype=np.int64))
        carry = 0
        for c, info in enumerate(cache.chunks):
            first, negative = carry, False
            for lengths in _chunk_lengths(cache, c, block):
                if len(lengths) == 0:
                    continue
                negative |= bool(lengths.min() < 0)
                part = np.cumsum(lengths, dtype=np.int64)
                part += carry
                carry = int(part[-1])
                put(part)
            if carry - first != info.tokens or negative:
                raise CorruptChunkError(f"{info.base}.idx: its document lengths add up to "
                                        f"{carry - first} tokens (negative ones: {negative}), "
                                        f"the cache says {info.tokens}; run 'shardwise "
                                        f"verify {cache.location}'")
    atomic_write_bytes(_sidecar(path), json.dumps({"xxh3_64": put.xxh3}).encode())


def stored_doc_starts(cache: Any, plan_root: Path, *, block: int = BLOCK
                      ) -> npt.NDArray[np.int64]:
    """Start of every stored document (``n_docs + 1`` values), memory-mapped; built once
    per node (per ``plan_root``) if absent or damaged (its checksum, in
    ``<key>.doc_starts.json``, checked on every load)."""
    path = starts_path(cache, plan_root)
    lock = path.with_suffix(".lock")
    return build_once(lock, open_lock=lambda: open_under(plan_root, lock.name, LOCK),
                      load=lambda: _load(path, cache.num_documents, cache.num_tokens),
                      build=lambda: _build(cache, path, block),
                      what=f"the document starts {path}", damaged=(ValueError,))


def doc_lengths_from_starts(path: Path, n_docs: int, *, block: int = BLOCK
                            ) -> npt.NDArray[np.integer]:
    """Every document's length from a starts file, as int32 while each fits (else int64),
    read in blocks: the builder of a plan holds 4 bytes per document, not the file."""
    out: npt.NDArray[np.integer] = np.empty(n_docs, dtype=np.int32)
    with open_regular(path) as f:
        major, _ = npy.read_magic(f)  # 1.0 is what npy_blocks writes
        read = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
        shape, _, dtype = read(f)
        if dtype != np.int64 or shape != (n_docs + 1,):
            raise ValueError(f"{path}: expected int64 of shape ({n_docs + 1},), got "
                             f"{dtype} {shape}; delete it to rebuild it")
        prev = int(np.fromfile(f, dtype=np.int64, count=1)[0])
        for a in range(0, n_docs, block):
            part = np.fromfile(f, dtype=np.int64, count=min(block, n_docs - a))
            if len(part) != min(block, n_docs - a):
                raise ValueError(f"{path}: ends after {a + len(part) + 1} of {n_docs + 1} "
                                 "values; delete it to rebuild it")
            lengths = np.diff(part, prepend=prev)
            prev = int(part[-1])
            if out.dtype == np.int32 and lengths.size and lengths.max() > _INT32_MAX:
                out = out.astype(np.int64)
            out[a: a + len(part)] = lengths
    return out


def _load_plan(directory: Path, fp: str, seed: int, epoch: int) -> DocShuffleIndex | None:
    """The published plan, its checksums checked (once per node) and its order sampled
    against the permutation (every load); ``None`` if absent; ValueError if damaged."""
    index = DocShuffleIndex.load(directory, fp, checked_here(directory))
    if index is None:
        return None
    return check_order(index, seed=seed, epoch=epoch, where=directory / fp)


def load_or_build(directory: Path, key_fields: Mapping[str, Any],
                  doc_lengths: Callable[[], npt.ArrayLike], *, seed: int, epoch: int,
                  seq_len: int, drop_last: bool, block: int = PLAN_BLOCK,
                  progress: Callable[[int], None] | None = None,
                  timeout: float = math.inf) -> DocShuffleIndex:
    """The document-shuffle plan for ``key_fields`` (the cache's identity) and these
    parameters, memory-mapped from ``directory``; built there once per node if absent or
    damaged (:func:`~shardwise.plan.doc_shuffle.write_doc_shuffle`, under
    ``<fingerprint>.lock``).

    ``doc_lengths()`` is called only by the builder (a cached plan costs no pass over the
    documents); ``progress(documents_done)`` after each block it writes. ``timeout``:
    seconds a waiter waits without the plan appearing (default: as long as a live
    builder builds; a dead one is replaced at once).
    """
    key = {**key_fields, "seed": seed, "epoch": epoch, "seq_len": seq_len,
           "drop_last": drop_last}
    conflict = {k: (key_fields[k], key[k]) for k in ("seed", "epoch", "seq_len", "drop_last")
                if k in key_fields and key_fields[k] != key[k]}
    if conflict:
        raise ValueError(f"key_fields disagree with the plan's parameters (given, used): "
                         f"{conflict}")
    fp = plan_fingerprint(key)
    directory = Path(directory)
    return build_once(
        directory / f"{fp}.lock", open_lock=lambda: open_under(directory, f"{fp}.lock", LOCK),
        load=lambda: _load_plan(directory, fp, seed, epoch),
        build=lambda: write_doc_shuffle(directory, fp, doc_lengths(), seed=seed, epoch=epoch,
                                        seq_len=seq_len, drop_last=drop_last, block=block,
                                        progress=progress),
        what=f"the document-shuffle plan {directory / fp}", damaged=(ValueError,),
        timeout=timeout)


class CacheDocuments:
    """A cache's documents as its token layout gives them to an order
    (:class:`~shardwise.read.orders.layout.Documents`): their starts and each epoch's
    document-shuffle plan, from the files of ``plan_dir`` (default: the cache's reader
    directory), asked on first use."""

    def __init__(self, cache: Any, plan_dir: Path | None = None) -> None:
        self.cache, self.plan_dir = cache, plan_dir
        # a map: mapped again in each process that uses it (concurrency.local; mapped
        # outside its lock: the first process on a node builds the file, others wait)
        self._starts: ProcessLocal[dict[str, Any]] = ProcessLocal(
            dict, name="the cache's document starts")

    @property
    def root(self) -> Path:
        """The plan directory, checked when first used (a reader of another order never
        looks at it)."""
        return Path(self.plan_dir) if self.plan_dir is not None else reader_dir(self.cache.root)

    def starts(self) -> npt.NDArray[np.int64]:
        kept = self._starts.get()
        if "starts" not in kept:
            kept["starts"] = stored_doc_starts(self.cache, self.root)
        starts: npt.NDArray[np.int64] = kept["starts"]
        return starts

    def shuffle(self, *, seed: int, epoch: int, seq_len: int, drop_last: bool
                ) -> DocShuffleIndex:
        c = self.cache
        key = {"cache": c.fingerprint, "tokens": c.num_tokens, "seed": seed, "epoch": epoch,
               "seq_len": seq_len, "drop_last": drop_last,
               "doc_shuffle_version": DOC_SHUFFLE_VERSION}
        return load_or_build(self.root, key, self._lengths, seed=seed, epoch=epoch,
                             seq_len=seq_len, drop_last=drop_last)

    def _lengths(self) -> npt.NDArray[np.integer]:
        """Every stored document's length (int32 while they fit), from the node's
        document-starts file: only a plan's builder needs it."""
        self.starts()
        return doc_lengths_from_starts(starts_path(self.cache, self.root),
                                       self.cache.num_documents)


__all__ = ["CacheDocuments", "doc_lengths_from_starts", "load_or_build", "starts_path",
           "stored_doc_starts"]
