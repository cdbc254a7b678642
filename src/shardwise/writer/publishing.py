"""A build task's chunks to its store, and each one reported once it is there:
:class:`Publisher`.

On local disk a chunk is published where it is made (temp names, fsync, renames: the
disk's own cache absorbs the writes). On an object store each file is a PUT that takes a
round trip and a server's work, so a chunk's files upload on one background thread while
the task reads and tokenizes the next chunk; a bucket's :meth:`publish` sends a chunk's
data files at once (then its metadata)::

    task thread   make chunk k │ make chunk k+1 ............ │ wait k, report k │ make k+2
    upload thread              │ PUT .bin ‖ PUT .idx, .json │ PUT chunk k+1's files ...

**The order that matters is kept.** A chunk is reported (its ``ChunkDone``, after which
the driver's ledger names it) only once every one of its files is in place: the report
waits for the upload. At most one chunk uploads while the next is made (bounded memory:
two chunks), and chunks are reported in their order, at the same points of the task's
messages as if each were published where it is made (a replayed Ray task yields the same
messages). A failed upload (past the store's one :class:`~shardwise.remote.RemotePolicy`
of timeouts and retries, which every PUT goes through) is raised in the task's thread as
the task's error, at its next publication or at its end: its chunk is never reported, so
the ledger never names a chunk whose files are missing, and a resumed build makes it
again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from shardwise.concurrency.threads import ThreadPool
from shardwise.format.chunk import ChunkFiles
from shardwise.storage.store import ChunkStore


class Publisher:
    """Publishes chunk files to ``store`` (in the background when the store says
    :attr:`~shardwise.storage.store.ChunkStore.publishes_ahead`), calling ``report()``
    for each chunk once its files are all in place."""

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self._pool: ThreadPool | None = None
        self._pending: tuple[Future[None], Callable[[], None]] | None = None

    def publish(self, files: ChunkFiles, report: Callable[[], None]) -> None:
        """Publish ``files``; ``report()`` once they are in place (and the chunk before
        them reported: first its upload is waited for)."""
        self.flush()
        if not self.store.publishes_ahead:
            files.publish(self.store)
            report()
            return
        if self._pool is None:
            self._pool = ThreadPool(1, name="shardwise-publish")
        self._pending = (self._pool.submit(partial(files.publish, self.store)), report)

    def flush(self) -> None:
        """Wait for the chunk uploading and report it; its upload's error is raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].result()
            pending[1]()

    def close(self, error: BaseException | None = None) -> None:
        """Stop the thread. With ``error`` (the task is ending on it): wait for an upload
        under way without reporting it (its chunk is made again when the build resumes)
        and, if it failed too, say so in a note on ``error``."""
        pending, self._pending = self._pending, None
        if pending is not None:
            failed = pending[0].exception()  # waits: no PUT goes on after the task
            if failed is not None and error is not None:
                error.add_note(f"(and a chunk's upload failed meanwhile: {failed!r})")
        if self._pool is not None:
            self._pool.close()
            self._pool = None


__all__ = ["Publisher"]
