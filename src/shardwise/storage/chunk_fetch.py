"""A chunk file of a cache on an object store, brought to the node: its metadata first
(checked against the ledger), then the file (checked against the metadata).

Why a module of its own: the order of round trips is the cost on a store far away. A
chunk's ``.bin`` size is known from the ledger (tokens × item size), so its first block
need not wait for the metadata that holds its checksum: both are asked for at once (two
concurrent GETs, one round trip), and the checksum is compared when the download ends::

    before:  GET meta.json ──50 ms──▶ GET .bin ──50 ms + transfer──▶   ≈ 2 round trips
    now:     GET meta.json ┐
             GET .bin      ┴──50 ms + transfer──▶                       ≈ 1 round trip

Files whose size only the metadata knows (``.idx``) and chunks whose metadata this
process already holds take the one-request path (:func:`~shardwise.storage.download.get_checked`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import META_SUFFIX, ChunkMeta
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.download import first_block, get_checked

if TYPE_CHECKING:
    from shardwise.storage.cache import Cache


def fetch_file(cache: Cache, info: ChunkInfo, suffix: str, until: float | None) -> Path:
    """Download (or find on this node) chunk file ``suffix``, pinned ``until`` if given."""
    assert cache.store is not None and cache.downloads is not None
    store, key = cache.store, info.stem + suffix
    if suffix == ".bin" and info.tokens and info.stem not in cache._metas:
        size = info.tokens * cache.dtype.itemsize

        def with_meta(tmp: Path) -> None:
            meta_data, first = first_block(store, key, size, also=info.stem + META_SUFFIX)
            spec = file_spec(cache, load_meta(cache, info, meta_data), info, suffix)
            get_checked(store, key, spec, tmp, first=first)

        return cache.downloads.fetch(key, size, with_meta, until)
    spec = file_spec(cache, cache._meta(info), info, suffix)
    return cache.downloads.fetch(key, int(spec["bytes"]),  # type: ignore[call-overload]
                                 lambda tmp: get_checked(store, key, spec, tmp), until)


def file_spec(cache: Cache, meta: ChunkMeta, info: ChunkInfo,
              suffix: str) -> dict[str, object]:
    """The metadata's entry (size, xxh3) for chunk file ``suffix``."""
    spec = meta.files.get(suffix)
    if spec is None:
        assert cache.store is not None
        raise CorruptChunkError(f"{cache.store.url_of(info.stem + META_SUFFIX)}: lists no "
                                f"{suffix} file; run 'shardwise verify {cache.location}'")
    return spec


def load_meta(cache: Cache, info: ChunkInfo, data: bytes | Exception) -> ChunkMeta:
    """A chunk's metadata from its bytes (or the error reading them raised), checked
    against the ledger and kept by the cache (read once per process)."""
    meta = cache._metas.get(info.stem)
    if meta is not None:
        return meta
    name = (cache.store.url_of(info.stem + META_SUFFIX) if cache.store is not None
            else str(info.base.with_name(info.base.name + META_SUFFIX)))
    advice = f"run 'shardwise verify {cache.location}'"
    if isinstance(data, FileNotFoundError):
        raise CorruptChunkError(f"{name}: named by the ledger but missing; {advice}")
    if isinstance(data, Exception):
        raise data
    if bytes_checksum(data) != info.meta_xxh3:
        raise CorruptChunkError(f"{name}: xxh3_64 {bytes_checksum(data)}, the ledger "
                                f"says {info.meta_xxh3}; {advice}")
    try:
        meta = cache._metas[info.stem] = ChunkMeta.from_dict(orjson.loads(data))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CorruptChunkError(f"{name}: not valid chunk metadata ({e}); {advice}") from e
    return meta


__all__ = ["fetch_file", "file_spec", "load_meta"]
