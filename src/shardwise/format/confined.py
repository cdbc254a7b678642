"""Files shardwise writes stay under the directory it was given: no symlink is followed.

A cache is untrusted input (docs/DESIGN.md, "Security model"): its author may ship
``.shardwise-plans``, a directory in it or a lock or log file as a symlink to anything the
reader can write. Every file a reader creates or appends is opened by :func:`open_under`:
each directory between the trusted ``root`` (the cache directory, ``local_dir`` or a
``plan_dir`` the user named) and the file is opened relative to the one before it
(``openat``) with ``O_DIRECTORY | O_NOFOLLOW`` and made if missing, and the file itself
with ``O_NOFOLLOW``; it must be a regular file. A symlink (or a FIFO, a device) on the way
is a :class:`~shardwise.errors.CacheError` naming it, never followed::

    cache/.shardwise-plans -> /home/me       open_under(cache, ".shardwise-plans/F.lock", LOCK)
    CacheError: cache/.shardwise-plans is a symlink; shardwise never writes through one ...
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from shardwise.errors import CacheError

LOCK = os.O_RDWR | os.O_CREAT
"""Flags of a lock file: created if missing, never truncated."""
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT
"""Flags of a log appended by every process of a node."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse(path: Path, what: str) -> CacheError:
    return CacheError(f"{path} is {what}; shardwise never writes through a link or into a "
                      "special file beside a cache (a cache is untrusted input): remove it "
                      "and run again")


def open_dir(root: Path, relative: str | PurePosixPath = "") -> int:
    """A descriptor of the directory ``root / relative``, each part below ``root`` opened
    without following a symlink (a CacheError) and made (0o755) if missing; a file where a
    directory should be is an OSError, as for ``mkdir``. ``root`` is trusted (made if
    missing too). The caller closes the descriptor."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    here = root
    try:
        for part in PurePosixPath(relative).parts:
            here = here / part
            if part in ("..", "/"):
                raise _refuse(here, "not a plain name")
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                sub = os.open(part, _DIR, dir_fd=fd)
            except NotADirectoryError as e:  # a file there is an OSError, as mkdir's
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise _refuse(here, "a symlink") from None
                e.filename = str(here)
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_under(root: Path, relative: str | PurePosixPath, flags: int, mode: int = 0o644
               ) -> int:
    """Open ``root / relative`` with ``flags`` (e.g. :data:`LOCK`, :data:`APPEND`) for a
    write: its directories as :func:`open_dir`, the file with ``O_NOFOLLOW`` (a symlink is
    refused, not followed) and ``O_NONBLOCK`` (a FIFO does not hang the open), and refused
    unless a regular file. The caller closes the descriptor."""
    rel = PurePosixPath(relative)
    dfd = open_dir(root, rel.parent)
    path = root / rel
    try:
        try:
            fd = os.open(rel.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         mode, dir_fd=dfd)
        except OSError as e:
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(rel.name, dir_fd=dfd, follow_symlinks=False).st_mode):
                    raise _refuse(path, "a symlink") from None
            if e.filename is None:
                e.filename = str(path)
            raise
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_regular(path: Path) -> BinaryIO:
    """``path`` open for reading, refused unless it is a regular file: a FIFO shipped
    where a file (a plan, its checksum) should be would block the open until someone
    writes to it, a device (a link to ``/dev/zero``) would never end. Opened with
    ``O_NONBLOCK`` (a FIFO's open returns at once), checked by ``fstat`` on that very
    descriptor, then made blocking again. A :class:`~shardwise.errors.CacheError` names
    it; a missing file is the OSError ``open`` raises."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheError(f"{path} is not a regular file (a FIFO or a device where shardwise "
                         "reads a file it wrote); remove it and run again: it is made anew")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`)."""
    with open_regular(path) as f:
        return f.read()


__all__ = ["APPEND", "LOCK", "open_dir", "open_regular", "open_under", "read_regular"]
