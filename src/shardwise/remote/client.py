"""Where a cache lives: a local directory, or a prefix on an object store (fsspec).

A local directory keeps the exact publication protocol of :mod:`shardwise.format.atomic`
(temp name, fsync, rename). An object store has no rename, so :class:`RemoteStore` writes
whole objects, each with one PUT: a chunk's data objects first, then its metadata, and
only then the ledger that names it (one PUT replacing the ledger object, which S3 makes
atomic: a reader sees the old ledger or the new one, never a mix). Readers trust only the
ledger, so an object the ledger does not name yet is invisible to them::

    s3://bucket/cache/manifest.json
    s3://bucket/cache/ledger.json                       replaced by one PUT per update
    s3://bucket/cache/chunks/00000/00000-00000.bin      PUT 1 ┐ at once
    s3://bucket/cache/chunks/00000/00000-00000.idx      PUT 1 ┘
    s3://bucket/cache/chunks/00000/00000-00000.json     PUT 2, then the ledger names it

Every request goes through one fault policy (:mod:`shardwise.remote.policy`: timeouts,
bounded retries with backoff, :class:`~shardwise.errors.RemoteError` past them), carried
by the store into every process and thread that uses it.

GETs of ``s3://`` objects go through obstore where it is installed
(:mod:`shardwise.remote.native`: no GIL held while a request runs; made per process),
everything else through fsspec; ``client="fsspec"`` keeps fsspec for all.

Credentials and endpoints come from fsspec/boto's usual environment and config
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws/…``) or from ``storage_options``
given at run time; nothing of them is ever written into the cache. Credentials in the URL
itself (``https://user:pass@…``, a signed query) reach the store and nothing else: ``url``,
which every name, message and key is made of, is the URL without them
(:func:`~shardwise.format.paths.redact_url`). Keys named by a cache
are relative and never leave its prefix (:func:`check_key`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from functools import partial
from typing import Any, BinaryIO, TypeVar

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError
from shardwise.format.files import check_key
from shardwise.format.paths import redact_url
from shardwise.remote.native import LARGEST_GET, NativeGets, native_options
from shardwise.remote.policy import RemotePolicy, is_transient

T = TypeVar("T")

SMALL_END = _SMALL = 64 << 20  # a range end past the end of any small object


def _native_gets(url: str, storage_options: dict[str, Any], policy: RemotePolicy,
                 client: str) -> NativeGets | None:
    """This process's obstore GETs (None: fsspec serves them; decided here, from this
    process's environment: a Ray worker on another node may lack obstore)."""
    args = native_options(url, storage_options) if client == "auto" else None
    return NativeGets(args, policy) if args is not None else None


def _connect(url: str, storage_options: dict[str, Any], policy: RemotePolicy
             ) -> tuple[Any, str]:
    """This process's fsspec filesystem for ``url`` and the prefix's path in it."""
    import fsspec

    protocol = url.split("://", 1)[0]
    options = (policy.s3fs_options(storage_options) if protocol in ("s3", "s3a")
               else storage_options)
    fs, path = fsspec.core.url_to_fs(url, **options)
    policy.quiet_client_retries(fs)
    return fs, path.rstrip("/")


def is_url(path: str | os.PathLike[str] | RemoteStore) -> bool:
    """True for ``scheme://…`` (``s3://``, ``gs://``, ``memory://``…); ``file://`` and
    plain paths are local."""
    if isinstance(path, RemoteStore):
        return True
    s = os.fspath(path)
    return "://" in s and not s.startswith("file://")


CLIENTS = ("auto", "fsspec")


class RemoteStore:
    """A cache prefix on an object store, through fsspec (GETs through obstore where it
    can: ``client="auto"``), every request under ``policy`` (default:
    :meth:`RemotePolicy.from_env`, the default policy unless ``SHARDWISE_REMOTE_POLICY`` is
    set). Picklable, and safe across fork: the clients are
    :class:`~shardwise.concurrency.local.ProcessLocal`, made in each process from the URL,
    the ``storage_options`` and the policy (fsspec's async filesystems refuse to run in a
    forked child, e.g. a DataLoader worker; obstore's runtime does not survive one).
    ``received``: bytes this object's GETs brought back."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 policy: RemotePolicy | None = None, client: str = "auto") -> None:
        if client not in CLIENTS:
            raise ConfigError(f"RemoteStore(client={client!r}): expected one of {CLIENTS}")
        self._url = url.rstrip("/")  # with its credentials: only to reach the store
        self.url = redact_url(self._url)  # what every name, message and key holds
        self.storage_options = dict(storage_options or {})
        self.policy = policy or RemotePolicy.from_env()
        self.client = client
        self.received = 0
        # this process's clients (.local): fsspec's async filesystems refuse to run in a
        # forked child, obstore's runtime does not survive one; a copy makes its own. The
        # factories hold the settings, not the store: no cycle keeps an obstore client
        # alive until the interpreter's last collection (dropped then, it aborts)
        settings = (self._url, self.storage_options, self.policy)
        self._fs: ProcessLocal[tuple[Any, str]] = ProcessLocal(partial(_connect, *settings),
                                                               name="fsspec")
        self._native: ProcessLocal[NativeGets | None] = ProcessLocal(
            partial(_native_gets, *settings, client), name="obstore")

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    @property
    def native(self) -> bool:
        """Whether this process's ranged GETs go through obstore
        (:mod:`shardwise.remote.native`)."""
        return self._gets() is not None

    def _gets(self) -> NativeGets | None:
        native = self._native.get()
        return native if native is not None and native.usable() else None

    @property
    def fs(self) -> Any:
        return self._fs.get()[0]

    @property
    def _path(self) -> str:
        return self._fs.get()[1]

    def _run(self, what: str, relative: str, call: Callable[[float], T],
             size: int | None = None) -> T:
        """``call(limit)`` under the policy (``limit``: the seconds after which fsspec
        cancels the try, its ``timeout=``); its errors name ``relative``'s URL."""
        return self.policy.run(call, what=what, url=self.url_of(relative), size=size)

    def _limit(self, seconds: float) -> dict[str, float]:
        """fsspec's ``timeout=`` for one try: an async filesystem (s3fs, gcsfs, adlfs)
        cancels the call after it; a synchronous one (``memory://``) takes no such
        argument and is not cancelled. s3fs makes its client at its first request
        (botocore's models loaded: 0.2–0.8 s, 5 s on a loaded machine), which the try's
        limit would count as the store's silence; it is made here first, before the try."""
        fs = self.fs
        if getattr(fs, "_s3", False) is None:  # an s3fs filesystem without its client yet
            fs.connect()
        return {"timeout": seconds} if getattr(fs, "async_impl", False) else {}

    def ready_to_fork(self) -> None:
        """Import this store's fsspec filesystem now, in a process about to fork DataLoader
        workers: each worker makes its own fsspec client (obstore's runtime does not
        survive fork), and importing s3fs there took 0.3–0.7 s of its first batch, in
        every worker at once, beside the downloads (a forked child inherits modules). One
        that cannot be imported is left to the worker's first read, which names it."""
        import fsspec

        with contextlib.suppress(ImportError, ValueError):
            fsspec.get_filesystem_class(self._url.split("://", 1)[0])

    def key(self, relative: str) -> str:
        """The filesystem path of ``relative`` (validated, never outside the prefix)."""
        rel = check_key(relative, where=self.url, root=self.url)
        _ = self.fs
        return f"{self._path}/{rel}"

    def url_of(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def put(self, relative: str, data: bytes | memoryview) -> None:
        """Write one whole object (a single PUT for small objects)."""
        key, body = self.key(relative), bytes(data)
        self._run("PUT", relative,
                  lambda t: self.fs.pipe_file(key, body, **self._limit(t)),
                  size=len(body))

    def get(self, relative: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""
        key = self.key(relative)  # fsspec: botocore checks a whole object's checksum
        got = bytes(self._run("GET", relative,
                              lambda t: self.fs.cat_file(key, **self._limit(t))))
        self.received += len(got)
        return got

    def read_range(self, relative: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object (fewer at its end), in one ranged GET
        (no client checks a part's checksum: the caller's own do); FileNotFoundError if
        it does not exist. (``open`` would ask for the object's size first: one more
        round trip per file on a store far away.)"""
        native = self._gets()
        if native is not None:
            rel = check_key(relative, where=self.url, root=self.url)
            got = self._run(f"GET bytes {start}-{stop} of", relative,
                            lambda t: native.get_range(rel, start, stop), size=stop - start)
        else:
            key = self.key(relative)
            got = bytes(self._run(f"GET bytes {start}-{stop} of", relative,
                                  lambda t: self.fs.cat_file(key, start=start, end=stop,
                                                             **self._limit(t)),
                                  size=stop - start))
        self.received += len(got)
        return got

    def get_many(self, relatives: list[str], *, checked: bool = False
                 ) -> dict[str, bytes | Exception]:
        """Small whole objects (each under 64 MiB) fetched concurrently, each in one ranged
        GET: ``relative → bytes``, or the exception that object raised
        (FileNotFoundError when it does not exist); ``checked``: as for
        :meth:`get_ranges`."""
        got = self.get_ranges([(r, 0, _SMALL) for r in relatives], checked=checked)
        return dict(zip(relatives, got, strict=True))

    def get_ranges(self, ranges: list[tuple[str, int, int]], *, checked: bool = False,
                   raw: bool = False) -> list[Any]:
        """Bytes ``[start, stop)`` of each ``(relative, start, stop)`` (fewer at an
        object's end), all requested at once (one round trip for all on a store far
        away); in the same order, each the bytes or the exception its object raised
        (``stop = SMALL_END``: the whole of a small object). ``checked``: the caller
        checks every byte against checksums of its own (a chunk's xxh3, its metadata's in
        the ledger), so the GIL-free client may serve whole objects too (it does not
        check their checksums as botocore does)."""
        if not ranges:
            return []
        native = self._gets() if checked or all(b != _SMALL for _, _, b in ranges) else None
        paths = ([check_key(r, where=self.url, root=self.url) for r, _, _ in ranges]
                 if native is not None else [self.key(r) for r, _, _ in ranges])
        got: list[bytes | Exception | None] = [None] * len(ranges)
        todo = list(range(len(ranges)))

        def attempt(limit: float) -> None:  # the ranges not answered yet, all at once
            answers = (native.get_ranges([(paths[i], *ranges[i][1:]) for i in todo], raw)
                       if native is not None else
                       self.fs.cat_ranges([paths[i] for i in todo],
                                          [ranges[i][1] for i in todo],
                                          [ranges[i][2] for i in todo], on_error="return",
                                          **self._limit(limit)))
            for i, a in zip(list(todo), answers, strict=True):
                got[i] = a if isinstance(a, Exception) or raw else bytes(a)
                if not (isinstance(a, Exception) and is_transient(a)):
                    todo.remove(i)
            if todo:  # retry those (and only those) under the policy
                raise got[todo[0]]  # type: ignore[misc]

        try:
            self._run(f"GET {len(ranges)} ranges, the first of", ranges[0][0], attempt,
                      size=sum(min(b - a, LARGEST_GET) for _, a, b in ranges))
        except Exception as e:  # noqa: BLE001 - each range still failing gets the error
            for i in todo:
                got[i] = e
        self.received += sum(memoryview(g).nbytes for g in got
                             if g is not None and not isinstance(g, Exception))
        return got

    def exists(self, relative: str) -> bool:
        key = self.key(relative)
        return bool(self._run("HEAD", relative,
                              lambda t: self.fs.exists(key, **self._limit(t))))

    def size(self, relative: str) -> int:
        key = self.key(relative)
        return int(self._run("HEAD", relative,
                             lambda t: self.fs.size(key, **self._limit(t))))

    def open(self, relative: str) -> BinaryIO:
        """A file object (its reads are not retried: prefer :meth:`read_range`)."""
        key = self.key(relative)
        f: BinaryIO = self._run("open", relative,
                                lambda t: self.fs.open(key, "rb", block_size=8 << 20))
        return f

    def download(self, relative: str, local: str | os.PathLike[str]) -> None:
        """Copy the object to the local file ``local``, streamed (a chunk may be large);
        FileNotFoundError if it does not exist."""
        key = self.key(relative)
        self._run("GET", relative,
                  lambda t: self.fs.get_file(key, os.fspath(local), **self._limit(t)))

    def list_keys(self) -> list[str]:
        """Every object under the prefix, as relative keys, sorted."""
        _ = self.fs
        try:
            found = self._run("LIST", "",
                              lambda t: self.fs.find(self._path, **self._limit(t)))
        except FileNotFoundError:
            return []
        head = self._path + "/"
        return sorted(p[len(head):] for p in found if p.startswith(head))

    def list_dir(self, relative: str) -> list[str]:
        """The names of the objects directly under ``relative/`` (one LIST request;
        through obstore where GETs go: no fsspec client to make, which costs a process
        its first call's set-up, several round trips, on the way to a cache's first
        batch)."""
        native = self._gets()
        if native is not None:
            rel = check_key(relative, where=self.url, root=self.url)
            return sorted(n for n in self._run("LIST", relative,
                                               lambda t: native.list_dir(rel)) if n)
        try:
            key = self.key(relative)
            found = self._run("LIST", relative, lambda t: self.fs.ls(
                key, detail=True, refresh=True, **self._limit(t)))
        except FileNotFoundError:
            return []
        names = (str(e["name"]).rsplit("/", 1)[-1] for e in found if e.get("type") == "file")
        return sorted(n for n in names if n)  # a store's marker of the directory itself: ''


    def stamp(self, relative: str) -> tuple[object, ...]:
        """What changes when the object is replaced: size and ETag (or time); ``()`` if it
        does not exist."""
        try:
            key = self.key(relative)
            info = self._run("HEAD", relative, lambda t: self.fs.info(
                key, refresh=True, **self._limit(t)))
        except FileNotFoundError:
            return ()
        return (info.get("size"), info.get("ETag") or info.get("LastModified")
                or info.get("mtime") or info.get("created"))

    def remove(self, relatives: list[str]) -> None:
        keys = [self.key(r) for r in relatives]
        if keys:
            self._run(f"DELETE {len(keys)} objects under", "",
                      lambda t: self.fs.rm(keys, **self._limit(t)))
            self.fs.invalidate_cache()
