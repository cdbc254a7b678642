"""Comparing a cache built from bucket sources with one built from local copies: equal
byte for byte once the local copies' paths are replaced by the objects' URLs (the only
thing a cache records of where a source lives: the manifest's and each chunk's
``source_path``, and the checksums over those files)."""

from __future__ import annotations

from pathlib import Path

from tests.cloud.conftest import s3fs_client
from tests.helpers_cache import cache_files

from shardwise.format.checksum import bytes_checksum
from shardwise.format.ledger import Ledger
from shardwise.format.ledger_index import LedgerView


def bucket_files(url: str) -> dict[str, bytes]:
    fs = s3fs_client()
    prefix = url.removeprefix("s3://").rstrip("/") + "/"
    return {k[len(prefix):]: fs.cat_file(k) for k in fs.find(prefix)}


def relocated(local: Path | dict[str, bytes], paths: dict[str, str]) -> dict[str, bytes]:
    """The files of a cache built from local copies as they would be had each source
    been read from its URL (``paths``: local path → URL)."""
    files = cache_files(local) if isinstance(local, Path) else dict(local)
    for name, data in files.items():
        if name.endswith(".json") and name != "ledger.json":
            for here, there in paths.items():
                data = data.replace(f'"{here}"'.encode(), f'"{there}"'.encode())
            files[name] = data
    ledger = Ledger.parse(files["ledger.json"])
    ledger.manifest_xxh3 = bytes_checksum(files["manifest.json"])
    for src in ledger.sources:
        for seg in src.segments:
            for c in seg.chunks:
                c.meta_xxh3 = bytes_checksum(files[f"{c.stem}.json"])
    files["ledger.json"] = ledger.to_json()
    files["ledger.index"] = LedgerView.from_ledger(ledger).to_bytes(
        bytes_checksum(files["ledger.json"]))
    return files


def assert_same_files(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    differing = [k for k in want if got[k] != want[k]]
    assert not differing, f"files differ: {differing[:10]}"
