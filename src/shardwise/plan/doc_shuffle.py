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

Cache files in the plan directory, for fingerprint ``F``: ``F.doc_order.npy`` (int32
while document ids fit: layout 2), ``F.cum_tokens.npy`` and ``F.json`` (written last: its
presence means the arrays are complete, and it holds their xxh3-64, checked when they are
mapped: layout 3; format/SPEC.md, "Plan caches"). Every file is
written to a temporary name, fsynced and renamed; :func:`write_doc_shuffle` streams the
arrays there block by block (:func:`doc_shuffle_blocks`), so the builder never holds
them. Which process builds (one per node, the others waiting) is decided above this
pure layer, in :mod:`shardwise.read.tokens.plans`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.format.atomic import TMP_PREFIX, atomic_write_bytes, npy_blocks
from shardwise.format.checksum import KnownFiles, map_checked_npy
from shardwise.format.confined import read_regular
from shardwise.plan._checks import IntArray, check_in_range, check_int
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation, derive_seed
from shardwise.plan.windows import num_windows

DOC_SHUFFLE_VERSION: int = 1
"""Part of every fingerprint; bump when the index built from the same inputs changes."""

SEED_TAG = "doc_shuffle"
LAYOUT = 3
"""The plan files' layout, in their metadata: 1 (no ``layout`` key) int64 ``doc_order``;
2 ``doc_order_dtype`` named (int32 while ids fit); 3 each array's xxh3-64 recorded
(``xxh3_64``), checked on load. Only 3 loads: a plan of 1 or 2 is rebuilt once (the order
is the same)."""
LAYOUTS = (3,)
BLOCK = 1 << 20
SAMPLE = 64  # positions of a loaded order checked against the permutation
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
        return int(self._plain[0][-1])  # not the map: its __getitem__ is Python (a read's)

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
        blocks = iter([(np.asarray(self.doc_order), np.asarray(self.cum_tokens[1:]))])
        _write(Path(directory), fingerprint, blocks, len(self.doc_order), self.seq_len,
               self.drop_last)

    @classmethod
    def load(cls, directory: Path, fingerprint: str, known: KnownFiles | None = None
             ) -> DocShuffleIndex | None:
        """Memory-map a saved index, ``None`` if absent; a damaged one raises ValueError
        naming the file (bytes that do not match their checksum, a short array, another
        shape or dtype, totals that disagree). ``known``: as
        :func:`~shardwise.format.checksum.map_checked_npy`'s."""
        directory = Path(directory)
        meta_path = directory / f"{fingerprint}.json"
        if not meta_path.exists():
            return None
        fix = f"delete {directory}/{fingerprint}.* to rebuild the plan"
        try:
            meta = json.loads(read_regular(meta_path))
            layout = meta.get("layout", 1)
            if layout in LAYOUTS:
                n_docs, total = meta["n_docs"], meta["total_tokens"]
                sums = {name: str(meta["xxh3_64"][name]) for name in _ARRAYS}
                seq_len, drop_last = meta["seq_len"], meta["drop_last"]
                if type(seq_len) is not int or type(drop_last) is not bool:
                    raise TypeError(f"seq_len {seq_len!r}, drop_last {drop_last!r}")
                want = {"doc_order": (np.dtype(meta["doc_order_dtype"]), (n_docs,)),
                        "cum_tokens": (np.dtype(np.int64), (n_docs + 1,))}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{meta_path}: unreadable plan metadata ({exc!r}); {fix}") from exc
        if layout not in LAYOUTS:
            raise ValueError(f"{meta_path}: plan layout {layout!r} (no checksums), this "
                             f"version reads {sorted(LAYOUTS)}; {fix}")
        arrays = {name: _map(directory / f"{fingerprint}.{name}.npy", *want[name],
                             sums[name], fix, known) for name in _ARRAYS}
        cum = arrays["cum_tokens"]
        if cum[0] != 0 or cum[-1] != total:
            raise ValueError(f"{directory / fingerprint}.cum_tokens.npy: runs from "
                             f"{int(cum[0])} to {int(cum[-1])}, the metadata says 0 to "
                             f"{total}; {fix}")
        return cls(arrays["doc_order"], cum, seq_len, drop_last)


def check_order(index: DocShuffleIndex, *, seed: int, epoch: int, where: Path,
                sample: int = SAMPLE) -> DocShuffleIndex:
    """``index`` if its order is ``(seed, epoch)``'s permutation at ``sample`` positions
    drawn afresh on each call, else ValueError naming ``where``. Why, beside the
    checksums: a plan shipped inside a cache can carry checksums of its own edits; an
    order that is not this permutation where the author cannot know it will be looked at
    is refused (and rebuilt). O(sample), a few microseconds."""
    n = len(index.doc_order)
    if n == 0:
        return index
    at = np.random.default_rng().integers(0, n, size=min(n, sample))
    want = Permutation(n, seed=derive_seed(seed, SEED_TAG), epoch=epoch)(at)
    got = np.asarray(index.doc_order[at], dtype=np.int64)
    if not np.array_equal(got, want):
        k = int(np.flatnonzero(got != want)[0])
        raise ValueError(f"{where}.doc_order.npy: document {int(got[k])} at shuffled "
                         f"position {int(at[k])}, the permutation of seed {seed}, epoch "
                         f"{epoch} puts {int(want[k])} there; delete {where}.* to rebuild "
                         "the plan")
    return index


def _map(path: Path, dtype: np.dtype, shape: tuple[int, ...], xxh3: str, fix: str,
         known: KnownFiles | None) -> IntArray:
    """``path`` memory-mapped, refused unless its bytes match ``xxh3`` (recorded when it
    was published) and it holds exactly ``dtype`` of ``shape``."""
    arr = map_checked_npy(path, xxh3, fix, known)
    if arr.dtype != np.dtype(dtype) or arr.shape != shape:
        raise ValueError(f"{path}: expected {np.dtype(dtype)} of shape {shape}, "
                         f"got {arr.dtype} {arr.shape}; {fix}")
    return arr  # type: ignore[no-any-return]


def order_dtype(n_docs: int) -> np.dtype:
    """``doc_order``'s dtype: int32 while document ids fit (half the bytes to write, map
    and page in at 100M documents), else int64. Plans of layout 1 are int64 throughout."""
    return np.dtype(np.int32 if n_docs <= np.iinfo(np.int32).max else np.int64)


def _check_lengths(doc_lengths: npt.ArrayLike) -> npt.NDArray[np.integer]:
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError(f"doc_lengths must be a 1-d integer array, got dtype {lengths.dtype} "
                         f"and shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"doc_lengths must be >= 0, got {lengths.min()} at document "
                         f"{int(np.argmin(lengths))}")
    return lengths


def doc_shuffle_blocks(doc_lengths: npt.ArrayLike, *, seed: int, epoch: int,
                       block: int = BLOCK) -> Iterator[tuple[IntArray, IntArray]]:
    """The plan in blocks of ``block`` shuffled positions: ``(doc_order[a:b],
    cum_tokens[a + 1:b + 1])``. Memory is O(block) beyond ``doc_lengths``, and the
    permutation runs ~5x faster on cache-sized blocks than on one huge array."""
    lengths = _check_lengths(doc_lengths)
    check_int(block, "block", minimum=1)
    perm = Permutation(lengths.size, seed=derive_seed(seed, SEED_TAG), epoch=epoch)
    dt, carry = order_dtype(lengths.size), 0
    for a in range(0, lengths.size, block):
        order = perm(np.arange(a, min(a + block, lengths.size), dtype=np.int64)).astype(dt)
        ends = np.cumsum(lengths[order], dtype=np.int64)
        ends += carry
        carry = int(ends[-1])
        yield order, ends


def build_doc_shuffle_index(doc_lengths: npt.ArrayLike, *, seed: int, epoch: int,
                            seq_len: int, drop_last: bool) -> DocShuffleIndex:
    """Shuffle documents for ``(seed, epoch)`` and index the shuffled stream (O(n_docs)),
    in memory (:func:`load_or_build` writes the same plan to disk block by block)."""
    lengths = _check_lengths(doc_lengths)
    check_int(seq_len, "seq_len", minimum=1)
    order = np.empty(lengths.size, dtype=order_dtype(lengths.size))
    cum = np.zeros(lengths.size + 1, dtype=np.int64)
    at = 0
    for part, ends in doc_shuffle_blocks(lengths, seed=seed, epoch=epoch):
        order[at: at + len(part)], cum[at + 1: at + 1 + len(part)] = part, ends
        at += len(part)
    return DocShuffleIndex(order, cum, int(seq_len), bool(drop_last))


def write_doc_shuffle(directory: Path, fingerprint: str, doc_lengths: npt.ArrayLike, *,
                      seed: int, epoch: int, seq_len: int, drop_last: bool,
                      block: int = BLOCK, progress: Callable[[int], None] | None = None
                      ) -> None:
    """Build the plan for ``(seed, epoch)`` straight into ``directory`` under
    ``fingerprint``, block by block: the builder holds ``doc_lengths`` plus O(block),
    never the arrays it writes (1.2 GB at 100M documents). Replaces a damaged plan of
    that fingerprint; ``progress(documents_done)`` is called after each block. Call it
    from one process at a time per fingerprint (``read.tokens.plans`` holds the lock)."""
    lengths = _check_lengths(doc_lengths)
    check_int(seq_len, "seq_len", minimum=1)
    _write(Path(directory), fingerprint,
           doc_shuffle_blocks(lengths, seed=seed, epoch=epoch, block=block), lengths.size,
           seq_len, drop_last, progress)


def _write(directory: Path, fingerprint: str, blocks: Iterator[tuple[IntArray, IntArray]],
           n_docs: int, seq_len: int, drop_last: bool,
           progress: Callable[[int], None] | None = None) -> None:
    """Publish a plan from its blocks: the metadata goes first (a damaged plan being
    replaced is unpublished), the arrays stream to temporary files, the metadata comes
    back last. Leftovers of a builder that died are removed first."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{fingerprint}.json").unlink(missing_ok=True)
    for stale in directory.glob(f"{TMP_PREFIX}{fingerprint}.*"):
        stale.unlink(missing_ok=True)
    dt, total, done = order_dtype(n_docs), 0, 0
    with npy_blocks(directory / f"{fingerprint}.doc_order.npy", dt, n_docs) as put_order, \
            npy_blocks(directory / f"{fingerprint}.cum_tokens.npy", np.int64,
                       n_docs + 1) as put_cum:
        put_cum(np.zeros(1, dtype=np.int64))
        for order, ends in blocks:
            put_order(order)
            put_cum(ends)
            done += len(order)
            total = int(ends[-1]) if len(ends) else total
            if progress is not None:
                progress(done)
    meta = {"version": DOC_SHUFFLE_VERSION, "permutation_version": PERMUTATION_VERSION,
            "layout": LAYOUT, "doc_order_dtype": dt.name, "seq_len": int(seq_len),
            "drop_last": bool(drop_last), "n_docs": int(n_docs), "total_tokens": total,
            "xxh3_64": {"doc_order": put_order.xxh3, "cum_tokens": put_cum.xxh3}}
    atomic_write_bytes(directory / f"{fingerprint}.json",
                       json.dumps(meta, sort_keys=True).encode())


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
