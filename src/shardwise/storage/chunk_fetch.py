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

from collections.abc import Callable
from pathlib import Path

from shardwise.errors import CorruptChunkError
from shardwise.format.chunk import META_SUFFIX, ChunkMeta
from shardwise.remote.client import RemoteStore
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.download import GROUP, DownloadDir, first_block, get_checked

MetaOf = Callable[[bytes | Exception], ChunkMeta]  # metadata bytes → checked metadata


def fetch_bin_with_meta(remote: RemoteStore, downloads: DownloadDir, info: ChunkInfo,
                        size: int, meta_of: MetaOf, until: float | None,
                        group: int = GROUP) -> Path:
    """Chunk ``info``'s ``.bin`` of ``size`` bytes (from the ledger), its first block asked
    for beside its metadata (``meta_of`` checks and keeps that), pinned ``until``."""
    key = info.stem + ".bin"

    def with_meta(tmp: Path) -> None:
        meta_data, first = first_block(remote, key, size, also=info.stem + META_SUFFIX,
                                       group=group)
        spec = file_spec(remote, meta_of(meta_data), info, ".bin")
        get_checked(remote, key, spec, tmp, first=first, group=group)

    return downloads.fetch(key, size, with_meta, until)


def fetch_checked(remote: RemoteStore, downloads: DownloadDir, info: ChunkInfo,
                  suffix: str, meta: ChunkMeta, until: float | None,
                  group: int = GROUP) -> Path:
    """Chunk file ``suffix`` whose metadata is known, checked against it (``group``: its
    blocks asked for at once)."""
    key, spec = info.stem + suffix, file_spec(remote, meta, info, suffix)
    return downloads.fetch(key, int(spec["bytes"]),  # type: ignore[call-overload]
                           lambda tmp: get_checked(remote, key, spec, tmp, group=group),
                           until)


def file_spec(remote: RemoteStore, meta: ChunkMeta, info: ChunkInfo,
              suffix: str) -> dict[str, object]:
    """The metadata's entry (size, xxh3) for chunk file ``suffix``."""
    spec = meta.files.get(suffix)
    if spec is None:
        raise CorruptChunkError(f"{remote.url_of(info.stem + META_SUFFIX)}: lists no "
                                f"{suffix} file; run 'shardwise verify {remote.url}'")
    return spec


__all__ = ["fetch_bin_with_meta", "fetch_checked", "file_spec"]
