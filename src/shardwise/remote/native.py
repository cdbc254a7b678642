"""GETs of ``s3://`` objects through obstore (Rust: the request, TLS and the copy of the
body run without the GIL), for the reader's hot path.

Why: through s3fs a GET costs the reader's process 6–8.6 ms of Python per 4 MiB (aiohttp,
botocore's signing, the event loop), all of it under the GIL that the reader's own thread
needs; obstore does the same work in Rust threads and hands back the bytes; and fsspec's
client costs a process 0.4–0.9 s of set-up on its first call, which was most of opening a
cache. Only ranged GETs go this way (a chunk's blocks, a batch's ranges, and small objects
the caller checks itself: a whole object's checksum is botocore's to check), and the LIST
of a directory (a cache's journal, read at open): everything else a store does (PUT,
HEAD, DELETE, a recursive LIST) stays on fsspec, which remains the whole client when obstore is
not installed, for other schemes than ``s3://``, and for options obstore does not take
(:func:`native_options`).

The client is **not fork-safe**: obstore runs every request on one Tokio runtime per
process, started on first use, and a forked child inherits it without its threads — a
request there waits for ever, past any timeout. So a :class:`NativeGets` is made lazily
per process (a :class:`~shardwise.concurrency.local.ProcessLocal` of
:class:`~shardwise.remote.client.RemoteStore`, like its fsspec filesystem), and a process
that may have inherited a started runtime uses fsspec instead (:meth:`NativeGets.usable`):
a fork of a process that made a client (by whatever means: ``os.fork`` too), and a
multiprocessing child (a DataLoader worker) that finds obstore already imported at its
first GET. A spawned worker, a torchrun rank
and a Ray worker import obstore afresh and make their own client.

Requests made at once run on Python threads of one pool per process, each blocked in
obstore's synchronous call with the GIL released, never through obstore's ``*_async``
functions: those hand each result to the asyncio loop from a Tokio thread, which calls
``loop.call_soon_threadsafe`` and, in its socket write, lets go of the GIL *after* the
result is queued. The loop may take it, the call return and the interpreter finalise
before that Tokio thread takes the GIL back; CPython then ends the thread with
``pthread_exit``, whose unwinding through Rust frames aborts the process (SIGABRT at
exit, seen under CPU load). A Tokio thread of the synchronous calls never touches Python;
the pool's threads are shardwise's, stopped before finalisation (:mod:`~shardwise.
concurrency.shutdown`).

A forked child never drops a client its parent made (:func:`~shardwise.concurrency.
shutdown.never_dropped_in_a_child`): dropping one wakes its connections' tasks on the
parent's runtime, which takes the runtime's scheduler lock, and a thread of the parent
(a Tokio worker, a thread of the pool in a request) may hold that lock as it forks. A
child dropping such a client through its garbage collector — in a cycle, or the store it
replaces at its first GET — then waited for ever (a forked test child's botocore set-up,
its collection run during the JSON load, blocked in Tokio's ``push_remote_task``; py-spy).

Faults meet the one policy (:mod:`shardwise.remote.policy`): obstore's own retries are off
(``max_retries=0``); its timeouts are the policy's (``connect_timeout``, ``read_timeout``
without a byte, and every try cut after ``try_limit`` of the reader's 32 MiB pieces, its
largest GETs: 10 s by default, so a silent store is a ``RemoteError`` within
``deadline + 10 s`` = 100 s, as through fsspec);
its errors are classified by the policy's ``is_transient``. Credentials come from
``storage_options`` (``key``/``secret``/``token``) or obstore's own environment chain
(``AWS_ACCESS_KEY_ID``…, web identity, container and instance credentials, refreshed
before they expire); a named ``AWS_PROFILE`` without explicit keys keeps fsspec (botocore
reads profiles, obstore does not).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Any

from shardwise.concurrency import shutdown
from shardwise.concurrency.local import generation
from shardwise.concurrency.threads import ThreadPool
from shardwise.remote.policy import RemotePolicy

LARGEST_GET = 32 << 20  # a download's pieces: the most one GET asks for in practice
AT_ONCE = 64  # GETs in flight at once on the pool, at most (its threads)
# fsspec/s3fs options that mean the same to obstore; any other keeps fsspec
_TAKEN = frozenset({"endpoint_url", "key", "secret", "token", "anon", "client_kwargs",
                    "config_kwargs", "skip_instance_cache", "use_ssl"})


def native_options(url: str, storage_options: dict[str, Any]) -> dict[str, Any] | None:
    """obstore's ``S3Store`` arguments for ``url`` with fsspec's ``storage_options``, or None
    where obstore cannot serve it (not installed, not ``s3://``, an option it has no
    equivalent of, a named profile without keys)."""
    scheme, _, rest = url.partition("://")
    if scheme not in ("s3", "s3a") or importlib.util.find_spec("obstore") is None:
        return None
    if set(storage_options) - _TAKEN:
        return None
    client_kwargs = dict(storage_options.get("client_kwargs") or {})
    if set(client_kwargs) - {"endpoint_url", "region_name"}:
        return None
    if os.environ.get("AWS_PROFILE") and "key" not in storage_options:
        return None
    bucket, _, prefix = rest.partition("/")
    config: dict[str, Any] = {}
    endpoint = (storage_options.get("endpoint_url") or client_kwargs.get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    if endpoint:
        config["endpoint"] = endpoint
    if "region_name" in client_kwargs:
        config["region"] = client_kwargs["region_name"]
    elif not os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        config["region"] = "us-east-1"
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key"),
                         ("token", "session_token")):
        if storage_options.get(ours):
            config[theirs] = storage_options[ours]
    if storage_options.get("anon"):
        config["skip_signature"] = True
    return {"bucket": bucket, "prefix": prefix.strip("/") or None, "config": config,
            "http": str(endpoint or "").startswith("http://")}


# The process generations (.local) in which an obstore runtime may have started (a client
# was made then). A process of another generation is a fork of one of those, by whatever
# means (os.fork too, which multiprocessing.parent_process() does not see): its runtime is
# dead. The one piece of process state here, as obstore's runtime itself is per process.
_STARTED_AT: set[int] = set()
# The one pool of every NativeGets of this process (threads on demand; a forked child's is
# empty, :class:`~shardwise.concurrency.threads.ThreadPool`). One per store instead started
# up to 63 threads for every RemoteStore that read several ranges (each made anew, e.g. per
# source file a build probes), 300-500 alive at once in a bucket build and 2,870 in a loop
# of them, each idle 5 s before it exits: every fork of the process copied them mid-work.
_POOL = ThreadPool(AT_ONCE, name="shardwise-obstore")


class NativeGets:
    """obstore GETs under one prefix, for one process (see the module doc)."""

    def __init__(self, args: dict[str, Any], policy: RemotePolicy) -> None:
        self.args, self.policy = args, policy
        self._store: Any = None
        self._usable: bool | None = None  # usable()'s answer, once asked

    def usable(self) -> bool:
        """Whether this process may use obstore: not a fork of a process whose runtime
        may have started (see the module doc)."""
        if self._usable is None:
            here = generation()
            forked_after_use = any(g != here for g in _STARTED_AT)
            child = multiprocessing.parent_process() is not None
            self._usable = not forked_after_use and not (child and "obstore" in sys.modules)
        return self._usable

    @property
    def store(self) -> Any:
        if self._store is None:
            from obstore.store import S3Store

            p = self.policy
            client: Any = {"allow_http": self.args["http"],
                      "connect_timeout": f"{p.connect_timeout}s",
                      "read_timeout": f"{p.read_timeout}s",
                      "timeout": f"{p.try_limit(LARGEST_GET)}s",
                      "pool_idle_timeout": "30s"}
            self._store = S3Store(self.args["bucket"], prefix=self.args["prefix"],
                                  config=self.args["config"], client_options=client,
                                  retry_config={"max_retries": 0})
            _STARTED_AT.add(generation())
            shutdown.never_dropped_in_a_child(self._store)  # see the module doc
        return self._store

    def close_at_exit(self, timeout: float) -> None:
        """At interpreter exit (:mod:`shardwise.concurrency.shutdown`): drop the client
        here, on the main thread of a whole interpreter, not in its finalisation, where
        a Rust object dropped late may abort the process (exit -6 seen in an opening
        child). ``timeout``: unused (nothing to join)."""
        self._store = None

    def get_range(self, key: str, start: int, stop: int, raw: bool = False) -> Any:
        """Bytes ``[start, stop)`` of ``key`` (fewer at its end; an error from past it);
        ``raw``: obstore's own buffer (a ``memoryview`` of it), not a copy."""
        import obstore

        if stop <= start:
            return b""
        got = obstore.get_range(self.store, key, start=start, end=stop)
        return memoryview(got) if raw else bytes(got)

    def list_dir(self, prefix: str) -> list[str]:
        """The names of the objects directly under ``prefix/`` (one LIST request; not a
        store's marker of the directory itself, which obstore names ``prefix``)."""
        import obstore

        head = prefix.rstrip("/") + "/"
        got = obstore.list_with_delimiter(self.store, head)
        paths = (str(o["path"]) for o in got["objects"])
        return [p[len(head):] for p in paths if p.startswith(head) and len(p) > len(head)]

    def get_ranges(self, ranges: list[tuple[str, int, int]], raw: bool = False) -> list[Any]:
        """Each ``(key, start, stop)`` at once (one round trip for all), each its bytes (a
        ``memoryview`` of obstore's buffer where ``raw``) or its error: the first on this
        thread, the others on the pool's (see the module doc: no ``*_async``)."""
        first, *rest = [partial(self._one, key, start, stop, raw) for key, start, stop in ranges]
        others = [self._submit(job) for job in rest]
        return [first()] + [_result(f, job) for f, job in zip(others, rest, strict=True)]

    def _one(self, key: str, start: int, stop: int, raw: bool) -> Any:
        try:
            return self.get_range(key, start, stop, raw)
        except Exception as e:  # noqa: BLE001 - returned, one per range
            return e

    def _submit(self, job: Callable[[], Any]) -> Future[Any]:
        try:
            return _POOL.submit(job)
        except RuntimeError:  # the pool closed (the interpreter exits): this thread runs it
            done: Future[Any] = Future()
            done.set_result(job())
            return done


def _result(future: Future[Any], job: Callable[[], Any]) -> Any:
    """``future``'s result; a job the pool cancelled (it closed at exit) runs here."""
    try:
        return future.result()
    except CancelledError:
        return job()


__all__ = ["LARGEST_GET", "NativeGets", "native_options"]
