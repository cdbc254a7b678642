"""Document-level shuffle before packing (Megatron's GPTDataset style), cached as ``.npy``.

Why: shuffling windows (``Permutation``) keeps the stored neighbours of every document
together inside a window. Shuffling *documents* first, then packing the shuffled stream,
mixes sources inside each window too. The price is one materialised array per epoch, so
it is built once, saved next to the cache keyed by a fingerprint and memory-mapped: a
second start does no planning work.

Layout: ``doc_order[p]`` is the stored document at shuffled position ``p``
(``Permutation(n_docs, seed=derive_seed(seed, "doc_shuffle"), epoch)``), and
``cum_tokens[p]`` is where it starts in the shuffled stream (``n_docs + 1`` values, the
last one the total). That is O(documents), not O(windows) like Megatron's sample index;
window ``w`` is resolved with two binary searches. Worked example (``seq_len = 4``, and
say the permutation puts the stored documents in the order 2, 0, 1)::

    doc_lengths (stored)   d0=3  d1=5  d2=2
    doc_order              [2, 0, 1]          cum_tokens [0, 2, 5, 10]
    shuffled stream        d2 d2 d0 d0 d0 d1 d1 d1 d1 d1
    window 0 = [0, 5)      pieces (2, 0, 2), (0, 0, 3)       # (doc, offset in doc, length)
    window 1 = [4, 9)      pieces (0, 2, 1), (1, 0, 4)

Cache files in the cache directory, for fingerprint ``F``: ``F.doc_order.npy``,
``F.cum_tokens.npy`` and ``F.json`` (written last: its presence means the arrays are
complete). Every file is written to a temporary name, fsynced and renamed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.format.atomic import atomic_write_bytes, save_npy
from shardwise.plan._checks import IntArray, check_in_range, check_int
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation, derive_seed
from shardwise.plan.windows import num_windows

DOC_SHUFFLE_VERSION: int = 1
"""Part of every fingerprint; bump when the index built from the same inputs changes."""

SEED_TAG = "doc_shuffle"
_ARRAYS = ("doc_order", "cum_tokens")


@dataclass(frozen=True, eq=False)
class DocShuffleIndex:
    """The shuffled document order and where each shuffled document starts.

    ``doc_order`` and ``cum_tokens`` may be read-only memory maps.
    """

    doc_order: IntArray
    cum_tokens: IntArray
    seq_len: int
    drop_last: bool

    @property
    def total_tokens(self) -> int:
        return int(self.cum_tokens[-1])

    @property
    def n_windows(self) -> int:
        return num_windows(self.total_tokens, self.seq_len, drop_last=self.drop_last)

    def span(self, w: int) -> tuple[int, int]:
        """Window ``w``'s token range in the shuffled stream (stop clipped; pad the rest)."""
        window = check_int(w, "window")
        check_in_range(np.asarray([window]), self.n_windows, "DocShuffleIndex", "windows")
        start = window * self.seq_len
        return start, min(start + self.seq_len + 1, self.total_tokens)

    def pieces(self, w: int) -> list[tuple[int, int, int]]:
        """Window ``w`` as ``(stored_doc_id, offset_in_doc, length)`` runs, in order.

        O(log n_docs + pieces); empty documents never appear.
        """
        start, stop = self.span(w)
        docs, skip, end = self.span_pieces(start, stop)
        cum = self._plain[0]
        first = int(cum.searchsorted(start, side="right")) - 1
        lengths = np.diff(cum[first: first + len(docs) + 1]).tolist()
        lengths[-1] = end
        lengths[0] -= skip
        return [(d, skip if j == 0 else 0, n)
                for j, (d, n) in enumerate(zip(docs.tolist(), lengths, strict=True)) if n]

    def span_pieces(self, start: int, stop: int) -> tuple[IntArray, int, int]:
        """Tokens ``[start, stop)`` of the shuffled stream (any span: a run of consecutive
        windows is read in one call) as the stored documents holding them, in order.

        Returns ``(docs, skip, end)``: each of ``docs`` is read whole, except the first,
        read from ``skip`` tokens in, and the last, read up to ``end`` tokens in (both
        when there is one). Empty documents may appear between them (no tokens). In the
        worked example, ``span_pieces(4, 9)`` is ``([0, 1], 2, 4)``. One binary search
        for both ends, O(pieces).
        """
        cum, order = self._plain
        if not 0 <= start < stop <= cum[-1]:
            raise ValueError(f"span [{start}, {stop}) is not a non-empty part of the "
                             f"shuffled stream [0, {self.total_tokens})")
        first, last = cum.searchsorted((start, stop - 1), side="right").tolist()
        return order[first - 1: last], start - int(cum[first - 1]), stop - int(cum[last - 1])

    @functools.cached_property
    def _plain(self) -> tuple[IntArray, IntArray]:
        """``cum_tokens`` and ``doc_order`` as plain arrays (a memory map's subclass costs
        microseconds per slice on the read path)."""
        return (np.asarray(self.cum_tokens).view(np.ndarray),
                np.asarray(self.doc_order).view(np.ndarray))

    def save(self, directory: Path, fingerprint: str) -> None:
        """Write the arrays and then the metadata file, each atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            save_npy(directory / f"{fingerprint}.{name}.npy", getattr(self, name))
        meta = {"version": DOC_SHUFFLE_VERSION, "permutation_version": PERMUTATION_VERSION,
                "seq_len": int(self.seq_len), "drop_last": bool(self.drop_last),
                "n_docs": int(self.doc_order.shape[0]), "total_tokens": self.total_tokens}
        data = json.dumps(meta, sort_keys=True).encode()
        atomic_write_bytes(directory / f"{fingerprint}.json", data)

    @classmethod
    def load(cls, directory: Path, fingerprint: str) -> DocShuffleIndex | None:
        """Memory-map a saved index, ``None`` if absent; refuse inconsistent files."""
        directory = Path(directory)
        meta_path = directory / f"{fingerprint}.json"
        if not meta_path.exists():
            return None
        fix = f"delete {directory}/{fingerprint}.* to rebuild the plan"
        try:
            meta = json.loads(meta_path.read_text())
            n_docs, seq_len, drop_last = meta["n_docs"], meta["seq_len"], meta["drop_last"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{meta_path}: unreadable plan metadata ({exc!r}); {fix}") from exc
        want = {"doc_order": (n_docs,), "cum_tokens": (n_docs + 1,)}
        arrays = {}
        for name in _ARRAYS:
            path = directory / f"{fingerprint}.{name}.npy"
            try:
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ValueError(f"{path}: cannot be read as .npy ({exc}); {fix}") from exc
            if arr.dtype != np.int64 or arr.shape != want[name]:
                raise ValueError(f"{path}: expected int64 of shape {want[name]}, "
                                 f"got {arr.dtype} {arr.shape}; {fix}")
            arrays[name] = arr
        return cls(arrays["doc_order"], arrays["cum_tokens"], int(seq_len), bool(drop_last))


def build_doc_shuffle_index(doc_lengths: npt.ArrayLike, *, seed: int, epoch: int,
                            seq_len: int, drop_last: bool) -> DocShuffleIndex:
    """Shuffle documents for ``(seed, epoch)`` and index the shuffled stream (O(n_docs))."""
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"doc_lengths must be a 1-d integer array, got dtype {lengths.dtype} "
                         f"and shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"doc_lengths must be >= 0, got {lengths.min()} at document "
                         f"{int(np.argmin(lengths))}")
    check_int(seq_len, "seq_len", minimum=1)
    order = Permutation(lengths.size, seed=derive_seed(seed, SEED_TAG), epoch=epoch)(
        np.arange(lengths.size, dtype=np.int64))
    cum = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths.astype(np.int64)[order], out=cum[1:])
    return DocShuffleIndex(order, cum, int(seq_len), bool(drop_last))


def plan_fingerprint(key_fields: Mapping[str, Any]) -> str:
    """sha256 of the sorted JSON of ``key_fields`` plus the plan versions (hex)."""
    payload = {"key_fields": dict(key_fields), "doc_shuffle_version": DOC_SHUFFLE_VERSION,
               "permutation_version": PERMUTATION_VERSION}
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise ValueError(f"key_fields must be JSON-serialisable (str, int, float, bool, "
                         f"None, lists and dicts of them): {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


def load_or_build(cache_dir: Path, key_fields: Mapping[str, Any],
                  build_fn: Callable[[], DocShuffleIndex]) -> DocShuffleIndex:
    """Load the index cached under ``plan_fingerprint(key_fields)``, else build, save and map it.

    ``key_fields`` must name everything ``build_fn`` depends on: the cache's content
    fingerprint, seed, epoch, seq_len and drop_last. Ranks that race to build write
    identical bytes; whichever rename lands last wins, and readers only ever see complete
    files.
    """
    fp = plan_fingerprint(key_fields)
    cached = DocShuffleIndex.load(cache_dir, fp)
    if cached is not None:
        return cached
    index = build_fn()
    if not isinstance(index, DocShuffleIndex):
        raise ValueError(f"build_fn must return a DocShuffleIndex, got {type(index).__name__}")
    index.save(cache_dir, fp)
    loaded = DocShuffleIndex.load(cache_dir, fp)
    return index if loaded is None else loaded
