"""Background work, written once: one read-ahead thread, one thread pool, one process
pool, one poller.

* :mod:`.readahead` -- :class:`ReadAhead`: a bounded queue fed by one daemon thread (the
  stream prefetcher, the sequential consumer, one-item-ahead loads).
* :mod:`.pool` -- :class:`ProcessPool`: worker processes that die with their parent
  (the writer's local executor, record processing).
* :mod:`.threads` -- :class:`ThreadPool`: a work queue on a resizable number of daemon
  threads (a remote cache's downloads, sized from measured latency; its verification).
* :mod:`.shutdown` -- both are stopped and joined at interpreter exit (a daemon thread
  still in native code at finalisation aborts the process).
* :mod:`.poll` -- :func:`wait_until`: the one wait/backoff rule for a producer (follow
  mode, producer directories, another process's download, the writer's lock).
* :mod:`.flock` -- advisory locks a forked child does not inherit.
* :mod:`.once` -- :func:`~.once.build_once`: one process per node builds a derived file
  (a plan), the others wait and load it; a dead builder is replaced.
* :mod:`.bounded` -- :class:`~.bounded.Bounded`: the one bounded (LRU) cache, by entries
  or weight, lock-free, pickling empty; every per-process cache of the read path is one
  (the caches of memory maps also count with storage/open_maps.py's budget).

This layer sits just above :mod:`shardwise.errors` and imports nothing else of shardwise,
so the writer, the readers and storage can all use it.
"""

from shardwise.concurrency.poll import Stopped, backoff, wait_until
from shardwise.concurrency.pool import Failure, ProcessPool, WorkerCrashed, die_with_parent
from shardwise.concurrency.readahead import ReadAhead
from shardwise.concurrency.threads import ThreadPool

__all__ = ["Failure", "ProcessPool", "ReadAhead", "Stopped", "ThreadPool", "WorkerCrashed",
           "backoff", "die_with_parent", "wait_until"]
