"""One bounded cache: an LRU map bounded by entries, by weight (bytes, tokens), or both.

Every per-process cache of the read path is one of these (chunk maps and ``.idx`` in
storage, with their views; document starts, order blocks, record tables, trace pointers,
blend runs), so eviction is written once::

    kept = Bounded(64)                       # at most 64 entries
    blocks = Bounded(weight=1 << 20, weigh=len)   # at most 2**20 by ``len`` of the values
    kept.get(c) or kept.put(c, load(c))

* The least recently used entry goes first; the entry just put is never evicted (a
  single value heavier than the weight bound is still kept, alone).
* ``on_evict(cache, key, value)`` is called for every entry the bounds evict and every
  entry :meth:`clear` drops (not for :meth:`pop`: the caller asked for it). It must be
  picklable (a module-level function) when the cache is pickled.
* It pickles **empty** (its bounds and hooks only): a cached memory map or array would
  pickle as a copy of its data; a copy in another process fills its own.
* No lock: a hit and a put are single dict operations under the GIL, so two threads
  (a reader and a look-ahead) may share one; a key evicted by another thread between a
  lookup and its ``move_to_end`` is a miss next time, never an error. Being lock-free it
  is also safe across ``fork``.
* ``None`` is not a value: :meth:`get` returns ``None`` for a miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """An LRU map of at most ``items`` entries and at most ``weight`` total
    ``weigh(value)`` (see the module doc)."""

    def __init__(self, items: int | None = None, *, weight: int | None = None,
                 weigh: Callable[[V], int] | None = None,
                 on_evict: Callable[[Bounded[K, V], K, V], None] | None = None) -> None:
        if items is None and weight is None:
            raise ValueError("Bounded: got neither items nor weight; a cache needs a bound "
                             "(e.g. Bounded(64) or Bounded(weight=1 << 20, weigh=len))")
        if (items is not None and items < 1) or (weight is not None and weight < 0):
            raise ValueError(f"Bounded: items={items}, weight={weight}; items must be >= 1 "
                             "and weight >= 0")
        if weight is not None and weigh is None:
            raise ValueError("Bounded: a weight bound needs weigh= (e.g. len or nbytes)")
        self.items, self.weight, self.weigh, self.on_evict = items, weight, weigh, on_evict
        self._d: OrderedDict[K, V] = OrderedDict()
        self.held = 0  # total weight of the entries (0 without weigh)

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recent), or None."""
        hit = self._d.get(key)
        if hit is not None:
            try:  # noqa: SIM105 (a hit is the hot path: try is ~10x cheaper than suppress)
                self._d.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return hit

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` as the most recent entry (replacing ``key``'s), evicting the
        least recent past the bounds; returns ``value``."""
        self.pop(key)
        self._d[key] = value
        if self.weigh is not None:
            self.held += self.weigh(value)
        self._shrink()
        return value

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key`` (no ``on_evict``); its value, or ``default``."""
        old = self._d.pop(key, None)
        if old is None:
            return default
        if self.weigh is not None:
            self.held -= self.weigh(old)
        return old

    def clear(self) -> None:
        """Drop every entry (``on_evict`` for each)."""
        dropped = list(self._d.items())
        self._d.clear()
        self.held = 0
        if self.on_evict is not None:
            for k, v in dropped:
                self.on_evict(self, k, v)

    def _over(self) -> bool:
        return ((self.items is not None and len(self._d) > self.items)
                or (self.weight is not None and self.held > self.weight))

    def _shrink(self) -> None:
        while len(self._d) > 1 and self._over():
            try:
                k, v = self._d.popitem(last=False)
            except KeyError:  # emptied by another thread
                return
            if self.weigh is not None:
                self.held -= self.weigh(v)
            if self.on_evict is not None:
                self.on_evict(self, k, v)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def keys(self) -> list[K]:
        """The keys, least recent first."""
        return list(self._d)

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())  # a copy: another thread may put meanwhile

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_d"], d["held"] = OrderedDict(), 0
        return d

    def __repr__(self) -> str:
        return (f"Bounded({len(self._d)} entries, items={self.items}, weight={self.weight}"
                f", held={self.held})")


__all__ = ["Bounded"]
