"""Global placement: a map-style dataset of packed, shuffled token windows.

Example ``i`` of the global order is window ``π_e(i mod n)`` of epoch ``e = i // n``, where
``n`` is the number of windows of ``seq_len + 1`` tokens cut from the concatenated
documents (consecutive windows share one token) and ``π_e`` is a keyed permutation
evaluated per index (:mod:`shardwise.plan.permutation`). Nothing per epoch is
materialised: ``len(ds)`` is one epoch, and indices past it continue into later epochs,
each reshuffled, at no cost up front. ``get_batch`` assembles a whole micro-batch in one
call (stacked arrays); ``__getitems__`` returns the same as a list of per-example dicts
(torch's protocol, :class:`~shardwise.read.rows.Rows`). Index :data:`PAD` (-1) yields a
fully masked example (evaluation padding).

Only the chunks holding the requested windows are opened (memory-mapped, lazily).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import RETIRED, Configured, fingerprint
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.plan.permutation import PERMUTATION_VERSION
from shardwise.plan.windows import dropped_tokens, num_windows
from shardwise.read.ahead import worker_read
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.epochs import EpochView
from shardwise.read.examples import NEXT_TOKEN, Output
from shardwise.read.guard import GuardedReader, PlacedByLoader
from shardwise.read.orders import Order, OrderOptions, Runs, TokenLayout, WindowOrder, order_class
from shardwise.read.orders.config import OrderedConfig
from shardwise.read.rows import ROW_FREE, Rows
from shardwise.read.tokens.assemble import Assembly
from shardwise.read.tokens.plans import CacheDocuments
from shardwise.storage.cache import Cache
from shardwise.storage.opening import reader_cache
from shardwise.world import World

ORDER_VERSION = 1


class Shuffle(Choice):
    """How the windows of an epoch are ordered.

    ``none``: stored order. ``window``: a keyed permutation of all windows (default).
    ``block``: blocks of consecutive windows permuted, then windows inside groups of
    blocks (read locality). ``document``: documents permuted before packing (Megatron
    style; its per-epoch index is cached as ``.npy`` and memory-mapped). Each is a part
    of :mod:`shardwise.read.orders`; an order registered there
    (:func:`~shardwise.read.orders.register_order`) is a ``shuffle=`` value too.
    """

    __option__ = "shuffle"

    NONE = "none"
    WINDOW = "window"
    BLOCK = "block"
    DOCUMENT = "document"



@dataclass(frozen=True)
class TokenConfig(OrderedConfig):
    """What defines the global order and the example layout (all of it is fingerprinted):
    a TokenDataset's keyword arguments, its state's fields, what a read config rebuilds it
    from (:mod:`shardwise.read.reader_config`).

    ``order`` is the options of the ``shuffle`` order, its own
    (:class:`~shardwise.read.orders.base.OrderOptions`; e.g. the block order's
    ``block_size``): given as keyword arguments by their names, held in a state (flat,
    beside the fields) only for the order that reads them.

    ``reset_position_ids``, ``cu_seqlens`` and ``eod_mask_loss`` follow Megatron's
    reset_position_ids / reset_attention_mask / eod_mask_loss: positions restart at each
    document start, document boundaries are returned for variable-length attention, and
    positions whose *input* is the end-of-document token get zero loss.
    """

    reader = "TokenDataset"

    seq_len: int
    seed: int = 0
    shuffle: Shuffle | str = Shuffle.WINDOW
    drop_last: bool = True
    reset_position_ids: bool = False
    cu_seqlens: bool = False
    eod_mask_loss: bool = False
    order: OrderOptions | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ConfigError(f"seq_len must be a positive integer, got {self.seq_len!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        object.__setattr__(self, "shuffle", parse_shuffle(self.shuffle))
        self.check_order()


def shuffle_name(shuffle: Shuffle | str) -> str:
    return shuffle.value if isinstance(shuffle, Shuffle) else str(shuffle)


def parse_shuffle(value: Any) -> Shuffle | str:
    """A built-in order as its :class:`Shuffle`, a registered one as its name;
    ConfigError naming every order otherwise."""
    if isinstance(value, Shuffle):
        return value
    try:
        return Shuffle(value)
    except ValueError:
        return order_class(value).name


class TokenDataset(GuardedReader, PlacedByLoader, EpochView, Configured):
    """Packed windows of a cache in a seeded global order; map-style.

    Its order is a :class:`TokenConfig`: pass its fields as keyword arguments (``seq_len``,
    ``seed``, ``shuffle``, ...) or ``config=`` one (arguments given too replace its fields).
    ``verify``: check ids and chunk checksums as they are read (default: as the cache was
    opened, which is on; ``False`` for a trusted cache; see
    :mod:`shardwise.storage.integrity`). ``output``: the examples' form
    (:class:`~shardwise.read.examples.Output`: int32 ids, or compact batches for
    DataLoader workers); not part of the order.

    >>> ds = TokenDataset(open_cache("cache/"), seq_len=2048, seed=1234)  # doctest: +SKIP
    >>> ds[0]["input_ids"].shape, len(ds)                                # doctest: +SKIP
    ((2048,), 48828)

    It is placed by the loader that walks it (``shardwise.torch.loader``, every
    integration): in a job of more than one rank, examples asked for by any other sampler
    are refused, since every rank would get the same ones
    (:class:`~shardwise.read.guard.PlacedByLoader`). ``world=World.single()`` lets this
    process read any example on purpose (evaluation on one rank, a look at the data).

    With ``drop_last`` (the default) the tokens after the last full window are left out:
    ``drops()`` and the ``repr`` say how many. Index :data:`PAD` is a masked example
    (``pads``), which an eval pass uses to fill its last step.
    """

    pads = True
    label_convention = NEXT_TOKEN  # labels are next-token targets: read/examples.py
    config_class = TokenConfig  # what it is built from: its arguments, state and fingerprint

    def __init__(self, cache: Cache | str | os.PathLike[str],
                 config: TokenConfig | None = None, *,
                 plan_dir: str | os.PathLike[str] | None = None, verify: bool | None = None,
                 output: Output | None = None, world: World | None = None,
                 **options: Any) -> None:
        self.output = Output.of(output)  # the examples' form (read/examples.py); not the order
        self._bind_world(world)
        self.cache = reader_cache(cache, verify)
        self.config = self.config_class.of(config, options)
        seq_len, drop_last = self.config.seq_len, self.config.drop_last
        if self.config.eod_mask_loss and self.cache.eod_id is None:
            raise ConfigError("eod_mask_loss needs the cache's end-of-document id, and this "
                              "cache has none (build with --append-eod, or a tokenizer that "
                              "has an end-of-text token)")
        self._plan_dir = Path(plan_dir) if plan_dir is not None else None
        self.num_windows = num_windows(self.cache.num_tokens, seq_len, drop_last=drop_last)
        if self.num_windows == 0:  # before the reader: it allocates seq_len positions
            raise ConfigError(f"the cache holds {self.cache.num_tokens} tokens: not one "
                              f"window of seq_len + 1 = {seq_len + 1} (lower seq_len, or "
                              "pass drop_last=False)")
        self._assembly = Assembly(self.cache, self.config)
        c = self.config
        self.layout = TokenLayout(self.cache.cum_tokens, seq_len, drop_last,
                                  CacheDocuments(self.cache, self._plan_dir))
        self.order: Order = order_class(shuffle_name(c.shuffle))(self.layout, seed=c.seed,
                                                                  options=c.order)

    # -- identity -------------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        """The plain fields a checkpoint must match (shown when a state is refused)."""
        return {**self.config.state(), "cache": self.cache.fingerprint,
                "cache_tokens": self.cache.num_tokens, "order_version": ORDER_VERSION,
                "permutation_version": PERMUTATION_VERSION}

    @property
    def fingerprint(self) -> str:
        """The hash of :meth:`state_config` with the keys retired from it that its order
        does not read, at the values every state held then
        (:data:`~shardwise.checkpoint.RETIRED`): a blend's saved sources match as before."""
        cfg = self.state_config()
        return fingerprint({**{k: v for k, v in RETIRED.items() if k not in cfg}, **cfg})

    def __len__(self) -> int:
        return self.num_windows

    def __repr__(self) -> str:
        c = self.config
        return (f"TokenDataset({self.cache!r}, seq_len={c.seq_len}, seed={c.seed}, "
                f"shuffle={shuffle_name(c.shuffle)!r}, windows={self.num_windows}, "
                f"{describe_drops(self.drops())})")

    def drops(self) -> list[Drop]:
        """The tokens no window holds (the last partial window, under ``drop_last``)."""
        c, total = self.config, self.cache.num_tokens
        n = dropped_tokens(total, c.seq_len, drop_last=c.drop_last)
        return [Drop(n, "tokens", "after the last full window (drop_last=True)", of=total)
                ] if n else []

    # -- order ------------------------------------------------------------------------------
    def windows(self, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Global example indices → window indices of their epoch (a window order: every
        shuffle but ``document``). A pure function of the indices (the order's)."""
        if not isinstance(self.order, WindowOrder):
            raise ConfigError(f"shuffle={shuffle_name(self.config.shuffle)!r} orders "
                              "documents, not windows: ask locate(indices) for the stored "
                              "tokens of its examples")
        return self.order.windows(indices)

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """The runs of stored tokens behind examples ``indices`` (columns ``chunk``,
        ``offset``, ``length``, in example order; ``tokens``: each example's count;
        :data:`PAD`: none): what the reader, prefetch and ``trace`` read (shifted by
        :meth:`set_epoch`'s epoch, as ``ds[i]`` is)."""
        return self.order.locate(self.positions(np.asarray(indices, dtype=np.int64)))

    # -- examples -------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, npt.NDArray[Any]]:
        batch = self.get_batch([int(index)])
        return {k: (v[0] if k not in ROW_FREE else v) for k, v in batch.items()}

    def __getitems__(self, indices: list[int] | npt.NDArray[np.integer]) -> Rows:
        """A micro-batch as torch's protocol wants it: a list of per-example dicts (row
        views), which also carries the stacked arrays (``.batch``) for shardwise's
        ``collate``. So ``DataLoader(ds, batch_size=8)`` and HF's collators work. In a
        DataLoader worker, with the batch's reads ahead (:func:`worker_read`)."""
        return Rows(worker_read(self, indices, lambda: self.get_batch(indices)))

    _getitems = __getitems__  # Grain's batched read (see read/rows.py)

    def get_batch(self, indices: list[int] | npt.NDArray[np.integer]
                  ) -> dict[str, npt.NDArray[Any]]:
        """A whole micro-batch as a dict of stacked arrays (one call, one allocation each).
        ``indices`` are positions of the global order (past ``len`` in later epochs), shifted
        by :meth:`set_epoch`'s epoch (:mod:`shardwise.read.epochs`)."""
        self.check_placed(indices)
        idx = list(self.positions(indices.tolist() if isinstance(indices, np.ndarray)
                                  else indices))
        runs = self.order.locate(idx)
        if self.output.compact:
            got = self._assembly.compact_from_runs(
                runs, self.output.token_dtype(self.cache.dtype))
            if got is not None:
                return got
        out = self._assembly.from_runs(runs)
        return out if self.output.is_default else self.output.shape(out, self.cache.dtype)

    def reader_pace(self, own_s: float | None) -> None:
        """The caller's own time on its last batch (batches made ahead: the loader's)."""
        self.cache.reader_pace(own_s)

    def prefetch(self, indices: list[int], *, early: bool = True) -> bool:
        """Start downloading the chunks examples ``indices`` will read, in the background
        (a cache on an object store; local chunks are mapped on demand, so a no-op), and,
        ``early``, their ranged reads while the chunks arrive (``Cache.prefetch_runs``;
        not where DataLoader workers read them: :meth:`read_early` there). Returns whether
        the cache wants the coming examples handed over sooner (its look-ahead is shorter
        than the measured latency needs: Cache.prefetch)."""
        runs = self._coming(indices)
        if runs is None:
            return False
        return self.cache.prefetch_runs(runs) if early else self.cache.prefetch(runs.chunks())

    def read_early(self, indices: list[int]) -> bool:
        """Start the ranged reads of coming examples ``indices`` (a DataLoader worker's
        next batch), their chunks downloaded by the loader's process (``Cache.read_early``).
        Returns whether the cache may take more."""
        runs = self._coming(indices)
        return False if runs is None else self.cache.read_early(runs)

    def _coming(self, indices: list[int]) -> Runs | None:
        """The runs of coming examples ``indices`` where the cache fetches ahead (None:
        every byte is here)."""
        if not self.cache.store.prefetches:
            return None
        return self.order.locate(list(self.positions(indices)))
