"""A node-local directory of downloaded cache files, bounded in bytes, shared by processes.

Why: the ranks of one node read chunks of one remote cache; each chunk should cross the
network once per node, and the local disk must not fill up. Every rank (and DataLoader
worker) opens the same directory; they coordinate through the file system only:

* a completed download is renamed into place (``chunks/00000/00000-00001.bin``): a file
  under its final name is always complete and checksummed;
* a download in progress is announced by a **claim file** created with
  ``O_CREAT | O_EXCL`` (``chunks/00000/.claim-00000-00001.bin``) holding the owner's pid,
  its start time and the reserved bytes. Other processes wait for the final name to
  appear. A claim whose owner is dead (pid gone, or reused by another process) is stale:
  the next process removes it and its partial ``.tmp-*`` file and downloads itself, so a
  crashed downloader never blocks anyone and leaves nothing that blocks a later run;
* the byte budget is accounted under a short ``flock`` on ``.lock`` (released by the
  kernel when a process dies; never held during a download): complete files plus the
  bytes reserved by live claims never exceed ``max_bytes``. Room is made by evicting the
  least recently used complete files (each hit touches the file's mtime)::

      max_bytes = 10, files a(4, used 1s ago) b(4, 5s ago); rank 1 claims c(4)
      used 8 + 4 > 10  → evict b (oldest)  → a c.claim        = 8 ≤ 10

* a file downloaded *ahead* of its reader is **pinned**: its mtime is set in the future
  (``fetch(..., until=t)``), and eviction skips files whose time has not come, so a
  chunk is never evicted before it is read (:mod:`shardwise.storage.prefetch`). The
  reader's use touches it back to now. Only a download a reader needs now may evict a
  pinned file, and only when nothing else can go (so a node whose processes pinned all
  of ``max_bytes`` never deadlocks); ``evicted_pinned`` counts those.

A process that memory-mapped a file keeps reading it if another evicts it (POSIX unlink
semantics); its blocks are freed when the mapping is dropped. No named shared memory, no
barriers: nothing here can deadlock on an uneven or crashed peer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from shardwise.concurrency import flock
from shardwise.concurrency.poll import check_wait_args, wait_until
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.atomic import TMP_PREFIX, open_temp, temp_path
from shardwise.format.confined import LOCK, open_dir, open_under
from shardwise.format.files import check_key
from shardwise.remote.client import SMALL_END, RemoteStore
from shardwise.remote.native import LARGEST_GET

CLAIM_PREFIX = ".claim-"
LOCK_NAME = ".lock"
PIECE = LARGEST_GET  # bytes of a chunk file one GET asks for (32 MiB)
GROUP = 2  # pieces of one file asked for at once (2 × 32 MiB in memory per download)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc is absent), so a
    reused pid is not mistaken for the claim's owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not start or _start_time(pid) in ("", start)


class DownloadDir:
    """Downloaded files under ``directory``, at most ``max_bytes`` in total.

    State (``stats()``): ``downloaded`` (key → downloads by this process), ``hits``,
    ``waits`` (fetches that waited for another process's download), ``evicted``,
    ``evicted_pinned``. A fetch
    waits by the one poller (:func:`~shardwise.concurrency.poll.wait_until`: 10 ms doubling
    to ``poll_interval``) and fails with :class:`CacheError` after ``timeout`` seconds.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int, *,
                 timeout: float = 600.0, poll_interval: float = 0.2) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigError(f"local_bytes must be a positive integer, got {max_bytes!r}")
        self.dir = Path(directory)
        check_wait_args(timeout, poll_interval)
        self.max_bytes, self.timeout, self.poll_interval = max_bytes, timeout, poll_interval
        self.downloaded: Counter[str] = Counter()
        self.hits = self.waits = self.evicted = self.evicted_pinned = 0
        self.dir.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"DownloadDir({str(self.dir)!r}, max_bytes={self.max_bytes})"

    def stats(self) -> dict[str, object]:
        return {"downloaded": dict(self.downloaded), "hits": self.hits, "waits": self.waits,
                "evicted": self.evicted, "evicted_pinned": self.evicted_pinned,
                "bytes": self.used_bytes(),
                "max_bytes": self.max_bytes}

    def fetch(self, key: str, size: int, download: Callable[[Path], None],
              until: float | None = None) -> Path:
        """The local path of ``key`` (``size`` bytes), downloaded by ``download(tmp)`` if no
        process of this node has it; waits while another process is downloading it.
        ``until`` (wall-clock seconds): pin the file until then (a download ahead of its
        reader); None: the reader uses it now (touched, unpinned)."""
        if size > self.max_bytes:
            raise ConfigError(f"{key} is {size} bytes, more than the local cache's "
                              f"local_bytes={self.max_bytes}; raise local_bytes")
        rel = PurePosixPath(check_key(key, where=str(self.dir), root=str(self.dir)))
        final = self.dir / rel
        claim = final.with_name(CLAIM_PREFIX + final.name)
        os.close(open_dir(self.dir, rel.parent))  # made; a symlink on the way: CacheError
        first = True

        def attempt() -> Path | None:
            nonlocal first
            with contextlib.suppress(FileNotFoundError):
                os.utime(final, None if until is None else (until, until))
                self.hits += first
                return final
            if self._claim(final, claim, size, now=until is None):
                try:
                    self._download(final, claim, download, until)
                except BaseException:
                    # a failed download's claim; a finished one's is gone with it, and
                    # unlinking it again could take another process's later claim
                    claim.unlink(missing_ok=True)
                    raise
                self.downloaded[key] += 1
                return final
            self.waits += first
            first = False
            return None

        return wait_until(attempt, timeout=self.timeout, poll_interval=self.poll_interval,
                          what=f"{final}", on_timeout=lambda waited: CacheError(
                              f"{final}: waited {waited:.0f}s for another process's "
                              f"download or for room within local_bytes={self.max_bytes}"))

    def _download(self, final: Path, claim: Path, download: Callable[[Path], None],
                  until: float | None) -> None:
        """Download into a temporary file, then, under the node's lock, rename it into
        place and drop the claim in one step: no other process sees both (its reserved
        bytes counted twice, evicting a file for room that is there) or neither (and
        downloads the file again)."""
        tmp = temp_path(final)
        try:
            download(tmp)
            if until is not None:
                os.utime(tmp, (until, until))
            with self._locked():
                os.replace(tmp, final)
                claim.unlink(missing_ok=True)
        finally:
            tmp.unlink(missing_ok=True)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The node's lock on this directory (a forked child never inherits it held)."""
        return flock.exclusive(lambda: open_under(self.dir, LOCK_NAME, LOCK))

    def _claim(self, final: Path, claim: Path, size: int, now: bool) -> bool:
        """Under the lock: reserve ``size`` bytes and create the claim. False if another
        live process holds the claim, the file appeared, or there is no room yet (``now``:
        the reader needs it now, so pinned files may go as a last resort)."""
        with self._locked():
            # the claim before the file: a downloader renames its file into place, then
            # drops its claim (both under this lock since; the order still holds without
            # it: looking at the file first could miss both and download it again)
            if claim.exists() and self._live_claim(claim) is not None:
                return False
            if final.exists():
                return False
            if not self._make_room(size, now):
                return False
            try:
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                pid = os.getpid()
                os.write(fd, f"{pid} {_start_time(pid)} {size}".encode())
            finally:
                os.close(fd)
            return True

    def _live_claim(self, claim: Path) -> int | None:
        """The bytes a claim reserves, or None after removing it (and its owner's partial
        download) if its owner is dead. Called under the lock."""
        try:
            pid_s, start, size_s = claim.read_text().split(" ")
            pid, size = int(pid_s), int(size_s)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # empty: its owner died before writing it
            pid, start, size = -1, "", 0
        if pid > 0 and _alive(pid, start):
            return size
        target = claim.name[len(CLAIM_PREFIX):]
        for tmp in claim.parent.glob(f"{TMP_PREFIX}{target}.{pid}.*"):
            tmp.unlink(missing_ok=True)
        claim.unlink(missing_ok=True)
        return None

    def _scan(self) -> tuple[list[tuple[float, int, Path]], int]:
        """Complete files as (mtime, size, path), and the bytes live claims reserve."""
        files, reserved = [], 0
        for dirpath, dirnames, names in os.walk(self.dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]  # e.g. plans
            for name in names:
                p = Path(dirpath) / name
                if name.startswith(CLAIM_PREFIX):
                    reserved += self._live_claim(p) or 0
                elif not name.startswith("."):
                    try:
                        st = p.stat()
                    except FileNotFoundError:
                        continue
                    files.append((st.st_mtime, st.st_size, p))
        return files, reserved

    def used_bytes(self) -> int:
        """Bytes of complete files plus bytes reserved by live downloads (under the lock:
        a claim being written is empty for a moment, and would look like a dead one's)."""
        with self._locked():
            files, reserved = self._scan()
        return sum(size for _, size, _ in files) + reserved

    def _make_room(self, size: int, now: bool) -> bool:
        """Evict least recently used files until ``size`` more bytes fit: unpinned ones
        first; pinned ones (soonest lapsing first) only for a reader that needs ``now``."""
        files, reserved = self._scan()
        used = sum(s for _, s, _ in files) + reserved
        stamp = time.time()
        order = sorted(files, key=lambda f: f[0])
        pinned = [f for f in order if f[0] > stamp]
        for mtime, s, p in [f for f in order if f[0] <= stamp] + (pinned if now else []):
            if used + size <= self.max_bytes:
                break
            try:
                p.unlink()
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
            used -= s
            self.evicted += 1
            self.evicted_pinned += mtime > stamp
        return used + size <= self.max_bytes


def pieces(start: int, want: int, group: int) -> list[tuple[int, int]]:
    """The next ``group`` pieces ``(start, stop)`` of a file of ``want`` bytes from
    ``start``: :data:`PIECE` bytes each, the one reaching the end asking one byte past it
    (so an object longer than its metadata is seen, not silently cut)."""
    return [(a, want + 1 if a + PIECE >= want else a + PIECE)
            for a in range(start, want, PIECE)[:group]]


First = list[tuple[tuple[int, int], "bytes | memoryview | Exception"]]


def first_block(store: RemoteStore, key: str, size: int, *, also: str,
                group: int = GROUP) -> tuple[bytes | Exception, First]:
    """Small object ``also`` (a chunk's metadata) and the first ``group`` pieces of ``key``
    (``size`` bytes expected), asked for at once: one round trip for all. Each is its bytes
    or the exception reading it raised; the pieces as ``((start, stop), answer)``."""
    asked = pieces(0, size, group) if size else [(0, 1)]
    small, *got = store.get_ranges([(also, 0, SMALL_END)] + [(key, a, b) for a, b in asked],
                                   checked=True, raw=True)  # the metadata's xxh3 is in the ledger
    return (small if isinstance(small, Exception) else bytes(small),
            list(zip(asked, got, strict=True)))


def get_checked(store: RemoteStore, key: str, spec: dict[str, object], tmp: Path, *,
                first: First | None = None, group: int = GROUP) -> None:
    """Download ``key`` into the new file ``tmp`` (:func:`~shardwise.format.atomic.open_temp`:
    created exclusively, no symlink followed) in pieces, checking size and xxh3
    (``spec``: the chunk metadata's entry for the file) as it streams.

    Each piece is one ranged GET of :data:`PIECE` bytes (no HEAD first: the size is known),
    ``group`` of them asked for at once (one round trip; a connection each), then hashed
    and written in order, each with one ``write`` of the client's own buffer (no copy in
    Python); a file of up to ``group`` pieces costs one round trip. ``first``: the pieces
    :func:`first_block` fetched (used where they are the ones this asks for first);
    ``group=1``: one piece after another."""
    import xxhash

    url, want = store.url_of(key), int(spec["bytes"])  # type: ignore[call-overload]
    h, got = xxhash.xxh3_64(), 0
    out = open_temp(tmp)  # created afresh, never through a symlink
    fd = out.fileno()
    try:
        if not want:
            got = _write(fd, h, store.get(key))
        while want and got <= want:
            asked = pieces(got, want, group)
            if not asked:
                break
            if first is not None and [r for r, _ in first] == asked:
                answers = [a for _, a in first]
            else:
                answers = store.get_ranges([(key, a, b) for a, b in asked], checked=True,
                                           raw=True)
            first = None
            got, ended = _write_pieces(asked, answers, h, fd, got)
            if ended:
                break
    except FileNotFoundError:
        raise CorruptChunkError(f"{url}: named by the ledger but missing; run 'shardwise "
                                f"verify {store.url}'") from None
    finally:
        out.close()
    if got != want or h.hexdigest() != spec["xxh3_64"]:
        what = (f"{got}{'+' if got > want else ''} bytes, the metadata says {want}"
                if got != want else
                f"xxh3_64 {h.hexdigest()}, the metadata says {spec['xxh3_64']}")
        raise CorruptChunkError(f"{url}: {what}; run 'shardwise verify {store.url}'")


def _write_pieces(asked: list[tuple[int, int]], answers: list[bytes | memoryview | Exception],
                  h: Any, fd: int, got: int) -> tuple[int, bool]:
    """Hash and write each piece of ``asked`` (``(start, stop)`` each) in order: the bytes
    written so far, and whether the file ended (a piece shorter than asked)."""
    for (a, stop), answer in zip(asked, answers, strict=True):
        if isinstance(answer, Exception):
            raise answer
        piece = memoryview(answer)[:stop - a]
        got += _write(fd, h, piece)
        if len(piece) < stop - a or not len(piece):
            return got, True
    return got, False


HASH_SLICE = 1 << 20  # bytes hashed per call: the GIL is let go between them


def _write(fd: int, h: Any, data: bytes | memoryview) -> int:
    """Hash ``data`` and append it to ``fd`` (one ``write`` unless the kernel takes less).
    Hashed a :data:`HASH_SLICE` at a time: xxhash holds the GIL for a whole call, and a
    32 MiB piece at once kept the reader's thread from its batch for 7 ms unloaded, 50
    and more on a busy machine (a wait over 50 ms in a 20 ms training step)."""
    view, done = memoryview(data), 0
    for a in range(0, len(view), HASH_SLICE):
        h.update(view[a:a + HASH_SLICE])
    while done < len(view):
        done += os.write(fd, view[done:])
    return done
