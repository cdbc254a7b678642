"""Opening a cache: a shardwise cache directory, a Megatron ``prefix``, or a cache on an
object store by its URL, as a :class:`~shardwise.storage.cache.Cache`.

A shardwise cache is opened from its manifest and the ledger's view (``ledger.index``:
the visible chunks as columns, or ``ledger.json`` parsed when there is no current index),
so opening costs the same few milliseconds for 10 or 100,000 chunks; no chunk file is
touched. A Megatron prefix is one chunk, its ``.idx`` checked against its ``.bin``. A
cache on an object store reads its manifest and ledger from the store and gets a
node-local download directory (see :mod:`shardwise.storage.bucket`).

This is the one place that decides, from a path, where a cache lives
(:func:`open_store`): everything after talks to a
:class:`~shardwise.storage.store.ChunkStore`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.checkpoint import fingerprint
from shardwise.errors import ConfigError, CorruptChunkError, ManifestError
from shardwise.format.chunk import ChunkKind
from shardwise.format.ledger import LEDGER_NAME, read_view
from shardwise.format.ledger_index import LedgerView
from shardwise.format.manifest import MANIFEST_NAME, Manifest
from shardwise.format.megatron import read_idx
from shardwise.format.paths import user_cache_dir
from shardwise.remote.client import RemoteStore, is_url
from shardwise.storage.bucket import BucketStore
from shardwise.storage.cache import Cache
from shardwise.storage.chunk_table import ChunkInfo, ChunkTable
from shardwise.storage.download import DownloadDir
from shardwise.storage.heads import NodeHeads
from shardwise.storage.local import LocalStore
from shardwise.storage.store import ChunkStore

DEFAULT_LOCAL_BYTES = 8 << 30


def open_store(path: str | os.PathLike[str],
               storage_options: dict[str, Any] | None = None) -> ChunkStore:
    """The store of a cache to write (a build): a directory, or a prefix on an object
    store by its URL (``file://`` is a directory)."""
    if is_url(path):
        return BucketStore(RemoteStore(os.fspath(path), storage_options))
    s = os.fspath(path)
    return LocalStore(s[len("file://"):] if s.startswith("file://") else s)


def _cache_of(store: ChunkStore, manifest: Manifest, view: LedgerView, *,
              verify: bool) -> Cache:
    """An open cache of ``view``'s visible chunks, read through ``store``. A ledger with
    another number of sources than the manifest lists is refused: one that left a source
    out made readers serve 29 of 54 examples, silently (``verify`` reported it)."""
    if len(view.sources) != len(manifest.sources):
        raise ManifestError(f"{store.name(LEDGER_NAME)}: {len(view.sources)} sources, "
                            f"{store.name(MANIFEST_NAME)} lists {len(manifest.sources)}; the "
                            "ledger is damaged or was edited: rebuild the cache, or run "
                            "'shardwise verify' on it")
    table = ChunkTable(store.root, ChunkKind(manifest.chunk_kind), view.chunks,
                       where=store.name(LEDGER_NAME))
    return Cache(store, manifest=manifest, chunks=table, dtype=np.dtype(manifest.dtype),
                 eod_id=manifest.tokenizer.eod_id, vocab_size=manifest.tokenizer.vocab_size,
                 finished=view.finished, errors=dict(view.errors),
                 fingerprint=fingerprint(manifest.identity()), verify=verify,
                 sources=view.sources)


def _open_shardwise(store: ChunkStore, verify: bool) -> Cache:
    view, _ = read_view(store)
    manifest = Manifest.load(store, xxh3=view.manifest_xxh3)
    return _cache_of(store, manifest, view, verify=verify)


def _open_megatron(prefix: Path, verify: bool) -> Cache:
    idx = read_idx(prefix.with_name(prefix.name + ".idx"))
    st = os.stat(prefix.with_name(prefix.name + ".bin"))
    # O(1), not a pass over every length (0.2 s at 100M documents): where the last sequence
    # ends; the lengths are checked against it before use (Cache.index, and the builder of
    # document starts, read/tokens/plans.py)
    tokens = (int(idx.sequence_pointers[-1]) // idx.dtype.itemsize
              + int(idx.sequence_lengths[-1])) if idx.num_sequences else 0
    if st.st_size != tokens * idx.dtype.itemsize:
        raise CorruptChunkError(f"{prefix}.bin: size {st.st_size} bytes, {prefix.name}.idx "
                                f"promises {tokens * idx.dtype.itemsize}; run "
                                f"'shardwise verify {prefix}'")
    stem = prefix.name
    # a document of several sequences stays one document (Megatron's document_indices)
    info = ChunkInfo(stem, prefix, ChunkKind.TOKENS, 0, idx.num_documents, tokens)
    identity = {"megatron": stem, "bin_bytes": st.st_size,
                "sequences": idx.num_sequences, "dtype": idx.dtype.name,
                "head": idx.sequence_lengths[:4096].tolist(),
                "tail": idx.sequence_lengths[-4096:].tolist()}
    if idx.num_documents != idx.num_sequences:  # its documents (and their order) changed
        identity["documents"] = idx.num_documents
    fp = fingerprint(identity)
    return Cache(LocalStore(prefix.parent), manifest=None, chunks=[info], dtype=idx.dtype,
                 eod_id=None, vocab_size=None, finished=True, errors={}, fingerprint=fp,
                 verify=verify)


def _open_remote(remote: RemoteStore, local_dir: str | os.PathLike[str] | None,
                 local_bytes: int, verify: bool) -> Cache:
    """Under ``local_dir``: ``<key of the URL>/heads``, this node's snapshot of the head
    files (:mod:`shardwise.storage.heads`: one process per node fetches them), and
    ``<key of (URL, cache identity)>/``, the downloads (a cache rebuilt differently under
    the same URL never reuses stale ones)."""
    base = Path(local_dir) if local_dir is not None else user_cache_dir() / "remote"
    heads = NodeHeads(remote, base / fingerprint({"url": remote.url}))
    files = BucketStore(remote, heads=heads)
    view, _ = read_view(files)
    manifest = Manifest.load(files, xxh3=view.manifest_xxh3)
    key = fingerprint({"url": remote.url, "identity": manifest.identity()})
    downloads = DownloadDir(base / key, local_bytes)
    heads.refreshing()  # open: from now on, a refresh asks whether the ledger grew
    return _cache_of(BucketStore(remote, downloads, heads=heads), manifest, view,
                     verify=verify)


def reader_cache(cache: Cache | str | os.PathLike[str], verify: bool | None) -> Cache:
    """The cache a reader reads: ``cache`` itself, or opened from its path. ``verify``
    None follows the cache (opened here: on); an explicit value must agree with an open
    cache's, whose checks other readers may share."""
    if not isinstance(cache, Cache):
        return open_cache(cache, verify=verify is not False)
    if verify is not None and verify != cache.verify:
        raise ConfigError(f"verify={verify}, but {cache.location} was opened with "
                          f"verify={cache.verify}; pass verify={verify} to open_cache (the "
                          "checks belong to the open cache), or pass its path instead")
    return cache


def open_cache(path: str | os.PathLike[str] | RemoteStore, *,
               local_dir: str | os.PathLike[str] | None = None,
               local_bytes: int = DEFAULT_LOCAL_BYTES,
               storage_options: dict[str, Any] | None = None, verify: bool = True) -> Cache:
    """Open a shardwise cache directory, a Megatron dataset by its prefix, or a cache on
    an object store by its URL.

    For a URL, chunk files are downloaded into ``local_dir`` (default
    ``~/.cache/shardwise/remote``; give every node its own local disk), at most
    ``local_bytes`` per cache; the ranks of a node share it. Credentials come from the
    environment or ``storage_options`` (passed to fsspec), never from the cache.

    ``verify`` (default on): refuse token ids outside the vocabulary, and checksum every
    chunk this node reads, once (:mod:`shardwise.storage.integrity`); ``False`` trusts the
    cache. Structure (sizes, ``.idx`` against ``.bin``) is always checked.

    >>> cache = open_cache("cache/")                            # doctest: +SKIP
    >>> cache = open_cache("data/corpus_text_document")         # .bin/.idx beside it
    >>> cache = open_cache("s3://bucket/cache", local_dir="/nvme/sw", local_bytes=50 << 30)
    """
    if isinstance(path, RemoteStore) or is_url(path):  # a RemoteStore: its own RemotePolicy
        remote = (path if isinstance(path, RemoteStore)
                  else RemoteStore(os.fspath(path), storage_options))
        return _open_remote(remote, local_dir, local_bytes, verify)
    p = Path(path)
    if (p / MANIFEST_NAME).is_file():
        return _open_shardwise(LocalStore(p), verify)
    if p.with_name(p.name + ".idx").is_file() and p.with_name(p.name + ".bin").is_file():
        return _open_megatron(p, verify)
    if p.suffix in (".bin", ".idx") and p.with_suffix(".idx").is_file():
        return _open_megatron(p.with_suffix(""), verify)
    raise ManifestError(f"{p}: neither a shardwise cache (no {MANIFEST_NAME}) nor a Megatron "
                        f"prefix (no {p.name}.bin / {p.name}.idx)")
