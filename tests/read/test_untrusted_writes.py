"""A reader writes nothing outside its cache directory and its ``local_dir``: a symlink a
cache ships where a reader would write (the node's verified log, a lock, the reader
directory itself) is a named error, never followed; a chunk name with a control character
(a newline that would forge a line of the verified log) is refused by name. "Nothing
written outside" is checked by a snapshot of an outside directory: names, sizes, times."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import xxhash
from tests import cachefactory
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import CacheError, ManifestError
from shardwise.format.chunk import chunk_stem
from shardwise.format.paths import READER_DIR
from shardwise.read.tokens.plans import starts_path
from shardwise.storage.download import LOCK_NAME, DownloadDir, get_checked

L = 16
REFUSED = "is a symlink; shardwise never writes through a link"


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return make_cache(tmp_path / "cache", [sample_docs(40, seed=3)], chunk_docs=5,
                      vocab_size=1000, eod_id=0)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory the reader must leave alone, holding one file a log could append to."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "victim.txt").write_text("untouched\n")
    return out


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(directory)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(directory.rglob("*"))}


def read_all(ds: sw.TokenDataset) -> None:
    """Every example, then the verifier's end: the damage it found is raised by the next
    batch."""
    for k in range(0, len(ds), 4):
        ds.__getitems__(list(range(k, min(k + 4, len(ds)))))
    ds.cache.wait_for_verify()
    ds.__getitems__([0])


def log_name(cache_dir: Path) -> str:
    return f"{sw.open_cache(cache_dir).fingerprint}.{socket.gethostname()}.log"


def test_a_clean_read_writes_its_log_where_the_name_says(cache_dir: Path) -> None:
    read_all(sw.TokenDataset(cache_dir, seq_len=L, seed=1))
    log = cache_dir / READER_DIR / "verified" / log_name(cache_dir)
    assert len(log.read_text().splitlines()) == 16  # one line per .bin and .idx


@pytest.mark.parametrize("link", ["log", "verified", READER_DIR])
def test_a_symlinked_verified_log_or_directory_is_refused_and_not_followed(
        cache_dir: Path, outside: Path, link: str) -> None:
    plans = cache_dir / READER_DIR
    if link == READER_DIR:
        plans.symlink_to(outside, target_is_directory=True)
    elif link == "verified":
        plans.mkdir()
        (plans / "verified").symlink_to(outside, target_is_directory=True)
    else:
        (plans / "verified").mkdir(parents=True)
        (plans / "verified" / log_name(cache_dir)).symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    ds = sw.TokenDataset(cache_dir, seq_len=L, seed=1)
    with pytest.raises(CacheError, match=REFUSED):
        read_all(ds)
    assert snapshot(outside) == before
    assert (outside / "victim.txt").read_text() == "untouched\n"


def test_a_symlinked_reader_directory_gets_no_plan(cache_dir: Path, outside: Path) -> None:
    (cache_dir / READER_DIR).symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(CacheError, match=f"{READER_DIR} {REFUSED}"):
        sw.TokenDataset(cache_dir, seq_len=L, seed=1, shuffle="document", verify=False)[0]
    assert snapshot(outside) == before


def test_a_symlinked_lock_does_not_create_its_target(cache_dir: Path, outside: Path) -> None:
    plans = cache_dir / READER_DIR
    plans.mkdir()
    lock = starts_path(sw.open_cache(cache_dir), plans).with_suffix(".lock")
    lock.symlink_to(outside / "created-by-the-reader")  # dangling: O_CREAT would make it
    before = snapshot(outside)
    with pytest.raises(CacheError, match=f"{lock.name} {REFUSED}"):
        sw.TokenDataset(cache_dir, seq_len=L, seed=1, shuffle="document", verify=False)[0]
    assert snapshot(outside) == before


def test_a_symlinked_download_lock_is_refused(tmp_path: Path, outside: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    (node / LOCK_NAME).symlink_to(outside / "created-by-the-reader")
    before = snapshot(outside)
    with pytest.raises(CacheError, match=REFUSED), DownloadDir(node, 1 << 20)._locked():
        pass
    assert snapshot(outside) == before


@pytest.mark.parametrize("control", ["\n", "\x1b", "\x7f"])
def test_a_chunk_name_with_a_control_character_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, control: str) -> None:
    """A stem ``...\\nchunks/x 0123 ...`` would start a line of the verified log with the
    author's text; it is refused when the cache is opened, by name."""
    def stem(source: int, segment: int, index: int) -> str:
        plain = chunk_stem(source, segment, index)
        return plain + f"{control}forged" if index == 1 else plain

    monkeypatch.setattr(cachefactory, "chunk_stem", stem)
    root = make_cache(tmp_path / "cache", [sample_docs(20, seed=3)], chunk_docs=5)
    with pytest.raises(ManifestError, match="holds a control character"):
        sw.TokenDataset(root, seq_len=L, seed=1)
    assert not (root / READER_DIR).exists()


def test_a_fifo_for_a_log_is_refused_without_hanging(cache_dir: Path) -> None:
    """Opened for writing, a FIFO would block until someone reads it."""
    verified = cache_dir / READER_DIR / "verified"
    verified.mkdir(parents=True)
    os.mkfifo(verified / log_name(cache_dir))
    with pytest.raises(CacheError, match="is not a regular file"):
        read_all(sw.TokenDataset(cache_dir, seq_len=L, seed=1))


class _Bytes:
    """What :func:`get_checked` asks of a remote store, over one object in memory."""

    url = "s3://bucket/cache"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def url_of(self, key: str) -> str:
        return f"{self.url}/{key}"

    def get(self, key: str) -> bytes:
        return self.data

    def get_ranges(self, ranges: list[tuple[str, int, int]], **_: object) -> list[bytes]:
        return [self.data[a:b] for _, a, b in ranges]


KEY = "chunks/00000/00000-00001.bin"
DATA = bytes(range(256)) * 4


def _download(tmp: Path) -> None:
    get_checked(_Bytes(DATA), KEY, {"bytes": len(DATA), "xxh3_64": xxhash.xxh3_64_hexdigest(DATA)},
                tmp)


def test_a_download_never_writes_through_a_symlink_at_its_temporary_name(
        tmp_path: Path, outside: Path) -> None:
    tmp = tmp_path / f".tmp-{Path(KEY).name}.1.0badcafe"
    tmp.symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    with pytest.raises(CacheError, match=REFUSED):
        _download(tmp)
    assert snapshot(outside) == before


def test_a_download_never_writes_through_a_symlinked_directory_of_local_dir(
        tmp_path: Path, outside: Path) -> None:
    """``local_dir/chunks/00000`` a symlink: the claim, the temporary file and the chunk
    would all land in its target."""
    node = tmp_path / "node"
    (node / "chunks").mkdir(parents=True)
    (node / "chunks" / "00000").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(CacheError, match=f"00000 {REFUSED}"):
        DownloadDir(node, 1 << 20, timeout=5).fetch(KEY, len(DATA), _download)
    assert snapshot(outside) == before
    DownloadDir(tmp_path / "clean", 1 << 20).fetch(KEY, len(DATA), _download)
    assert (tmp_path / "clean" / KEY).read_bytes() == DATA
