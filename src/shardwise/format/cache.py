"""Opening a cache for reading: a shardwise cache directory or a Megatron ``prefix``.

A :class:`Cache` is a view of the ledger's visible chunks in global order, with prefix
sums of documents and tokens, so that planning needs no chunk file. Chunk files are
memory-mapped lazily, one chunk at a time, on first use; ``opened`` counts the chunks
whose token data a process has touched (the locality contract is tested with it), and
``opened_index`` the chunks whose ``.idx`` (document lengths, metadata only) it has
read. :meth:`Cache.refresh` re-reads the ledger of a cache that is still being built: the
visible chunk list only ever grows.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from shardwise.errors import CacheError, CorruptChunkError, ManifestError
from shardwise.format.chunk import ChunkKind
from shardwise.format.ledger import Ledger
from shardwise.format.manifest import MANIFEST_NAME, Manifest
from shardwise.format.megatron import MegatronIndex, open_bin, read_idx
from shardwise.format.paths import safe_join

MAX_OPEN_CHUNKS = 64


@dataclass(frozen=True)
class ChunkInfo:
    """A visible chunk: where its files are (``base`` + suffix) and what it holds."""

    stem: str
    base: Path
    kind: ChunkKind
    source: int
    documents: int
    tokens: int


class Cache:
    """A read-only view of a cache. Create it with :func:`open_cache`."""

    def __init__(self, root: Path, *, manifest: Manifest | None, chunks: list[ChunkInfo],
                 dtype: np.dtype, eod_id: int | None, vocab_size: int | None,
                 finished: bool, errors: dict[str, int], fingerprint: str) -> None:
        self.root = root
        self.manifest = manifest
        self.dtype = dtype
        self.eod_id = eod_id
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.finished = finished
        self.errors = errors
        self.chunks: list[ChunkInfo] = []
        self.cum_tokens = np.zeros(1, dtype=np.int64)
        self.cum_docs = np.zeros(1, dtype=np.int64)
        self.opened: Counter[str] = Counter()
        self.opened_index: Counter[str] = Counter()
        self._maps: OrderedDict[int, npt.NDArray[np.generic]] = OrderedDict()
        self._indexes: OrderedDict[int, MegatronIndex] = OrderedDict()
        self._extend(chunks)

    def __repr__(self) -> str:
        state = "finished" if self.finished else "building"
        return (f"Cache({str(self.root)!r}, chunks={len(self.chunks)}, "
                f"documents={self.num_documents}, tokens={self.num_tokens}, {state})")

    @property
    def is_megatron(self) -> bool:
        return self.manifest is None

    @property
    def num_tokens(self) -> int:
        return int(self.cum_tokens[-1])

    @property
    def num_documents(self) -> int:
        return int(self.cum_docs[-1])

    def _extend(self, chunks: list[ChunkInfo]) -> None:
        if not chunks:
            return
        self.chunks.extend(chunks)
        toks = np.fromiter((c.tokens for c in chunks), dtype=np.int64, count=len(chunks))
        docs = np.fromiter((c.documents for c in chunks), dtype=np.int64, count=len(chunks))
        self.cum_tokens = np.concatenate([self.cum_tokens, self.cum_tokens[-1] + np.cumsum(toks)])
        self.cum_docs = np.concatenate([self.cum_docs, self.cum_docs[-1] + np.cumsum(docs)])

    def refresh(self) -> int:
        """Re-read the ledger; append newly visible chunks; return how many appeared."""
        if self.manifest is None or self.finished:
            return 0
        ledger = Ledger.load(self.root)
        visible = _visible_chunks(self.root, ledger, ChunkKind(self.manifest.chunk_kind))
        for old, new in zip(self.chunks, visible, strict=False):
            if old.stem != new.stem:
                raise CacheError(f"{self.root}: the ledger reordered published chunks "
                                 f"({old.stem} became {new.stem}); the cache was rebuilt "
                                 "under a running reader")
        fresh = visible[len(self.chunks):]
        self._extend(fresh)
        self.finished = ledger.finished and len(visible) == len(self.chunks)
        self.errors = ledger.errors()
        return len(fresh)

    def _open(self, i: int) -> npt.NDArray[np.generic]:
        hit = self._maps.get(i)
        if hit is not None:
            self._maps.move_to_end(i)
            return hit
        info = self.chunks[i]
        if info.kind is not ChunkKind.TOKENS:
            raise CacheError(f"{info.base}: a {info.kind.value} chunk has no token array; "
                             "read it with the records reader")
        bin_path = info.base.with_name(info.base.name + ".bin")
        try:
            tokens = open_bin(bin_path, self.dtype)
        except FileNotFoundError:
            raise CorruptChunkError(f"{bin_path}: named by the ledger but missing; run "
                                    f"'shardwise verify {self.root}'") from None
        if len(tokens) != info.tokens:
            raise CorruptChunkError(f"{bin_path}: holds {len(tokens)} tokens, the ledger says "
                                    f"{info.tokens}; run 'shardwise verify {self.root}'")
        self.opened[info.stem] += 1
        self._maps[i] = tokens
        if len(self._maps) > MAX_OPEN_CHUNKS:
            self._maps.popitem(last=False)
        return tokens

    def tokens(self, i: int) -> npt.NDArray[np.generic]:
        """Chunk ``i``'s token ids (all its documents concatenated), memory-mapped."""
        return self._open(i)

    def index(self, i: int) -> MegatronIndex:
        """Chunk ``i``'s parsed ``.idx`` (document lengths), memory-mapped; does not touch
        the chunk's token data."""
        idx = self._indexes.get(i)
        if idx is not None:
            self._indexes.move_to_end(i)
            return idx
        info = self.chunks[i]
        try:
            idx = read_idx(info.base.with_name(info.base.name + ".idx"))
        except FileNotFoundError:
            raise CorruptChunkError(f"{info.base}.idx: named by the ledger but missing; run "
                                    f"'shardwise verify {self.root}'") from None
        if idx.num_sequences != info.documents:
            raise CorruptChunkError(f"{idx.path}: holds {idx.num_sequences} documents, the "
                                    f"ledger says {info.documents}; run 'shardwise verify "
                                    f"{self.root}'")
        self.opened_index[info.stem] += 1
        self._indexes[i] = idx
        if len(self._indexes) > MAX_OPEN_CHUNKS:
            self._indexes.popitem(last=False)
        return idx

    def doc_lengths(self, i: int) -> npt.NDArray[np.int32]:
        return self.index(i).sequence_lengths

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.generic]:
        """Tokens ``[start, stop)`` of the concatenated stream (may span chunks)."""
        first = int(np.searchsorted(self.cum_tokens, start, side="right")) - 1
        parts = []
        pos = start
        c = first
        while pos < stop:
            lo = pos - int(self.cum_tokens[c])
            hi = min(stop, int(self.cum_tokens[c + 1])) - int(self.cum_tokens[c])
            parts.append(self.tokens(c)[lo:hi])
            pos += hi - lo
            c += 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)


def _visible_chunks(root: Path, ledger: Ledger,
                    kind: ChunkKind = ChunkKind.TOKENS) -> list[ChunkInfo]:
    out = []
    for source, entry in ledger.global_order():
        base = safe_join(root, entry.stem, where=str(root / "ledger.json"))
        out.append(ChunkInfo(entry.stem, base, kind, source, entry.documents, entry.tokens))
    return out


def _identity_fingerprint(obj: object) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _open_shardwise(root: Path) -> Cache:
    manifest = Manifest.load(root)
    ledger = Ledger.load(root)
    kind = ChunkKind(manifest.chunk_kind)
    chunks = [ChunkInfo(c.stem, c.base, kind, c.source, c.documents, c.tokens)
              for c in _visible_chunks(root, ledger)]
    visible_all = ledger.finished
    return Cache(root, manifest=manifest, chunks=chunks, dtype=np.dtype(manifest.dtype),
                 eod_id=manifest.tokenizer.eod_id, vocab_size=manifest.tokenizer.vocab_size,
                 finished=visible_all, errors=ledger.errors(),
                 fingerprint=_identity_fingerprint(manifest.identity()))


def _open_megatron(prefix: Path) -> Cache:
    idx = read_idx(prefix.with_name(prefix.name + ".idx"))
    st = os.stat(prefix.with_name(prefix.name + ".bin"))
    stem = prefix.name
    info = ChunkInfo(stem, prefix, ChunkKind.TOKENS, 0, idx.num_sequences, idx.num_tokens)
    fp = _identity_fingerprint({"megatron": stem, "bin_bytes": st.st_size,
                                "sequences": idx.num_sequences, "dtype": idx.dtype.name,
                                "head": idx.sequence_lengths[:4096].tolist(),
                                "tail": idx.sequence_lengths[-4096:].tolist()})
    return Cache(prefix.parent, manifest=None, chunks=[info], dtype=idx.dtype, eod_id=None,
                 vocab_size=None, finished=True, errors={}, fingerprint=fp)


def open_cache(path: str | os.PathLike[str]) -> Cache:
    """Open a shardwise cache directory, or a Megatron dataset by its prefix.

    >>> cache = open_cache("cache/")                            # doctest: +SKIP
    >>> cache = open_cache("data/corpus_text_document")         # .bin/.idx beside it
    """
    p = Path(path)
    if (p / MANIFEST_NAME).is_file():
        return _open_shardwise(p)
    if p.with_name(p.name + ".idx").is_file() and p.with_name(p.name + ".bin").is_file():
        return _open_megatron(p)
    if p.suffix in (".bin", ".idx") and p.with_suffix(".idx").is_file():
        return _open_megatron(p.with_suffix(""))
    raise ManifestError(f"{p}: neither a shardwise cache (no {MANIFEST_NAME}) nor a Megatron "
                        f"prefix (no {p.name}.bin / {p.name}.idx)")
