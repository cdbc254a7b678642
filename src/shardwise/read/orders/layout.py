"""What a plan sees of a cache: its chunks' token counts, the window length, and the
documents on demand — never a reader.

An order is a pure plan over a :class:`TokenLayout`: it turns example indices into runs of
stored tokens (``locate``) from these numbers alone, so the same plan serves a
TokenDataset (the whole cache), a stream block (that block's chunks, in read order) and a
test (a layout of made-up sizes)::

    chunks of 5, 4 tokens, seq_len 3   cum_tokens [0, 5, 9]   windows [0 1 2 3] [3 4 5 6] ...
    window 1 = tokens [3, 7): chunk 0 offset 3 (2 tokens), chunk 1 offset 0 (2 tokens)

Document starts are what only the document order reads: they come from a
:class:`Documents` source the reader gives (a pass over every chunk's index, built once
per node and memory-mapped), asked on first use, never at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.plan.windows import num_windows

IntArray = npt.NDArray[np.int64]


class Documents(Protocol):
    """The stored documents of a layout, loaded on demand (a reader's files)."""

    def starts(self) -> IntArray:
        """Where each stored document starts in the stored stream (``n_docs + 1`` values,
        the total last), as a plain array."""
        ...

    def shuffle(self, *, seed: int, epoch: int, seq_len: int, drop_last: bool) -> Any:
        """Epoch ``epoch``'s document-shuffle plan
        (:class:`~shardwise.plan.doc_shuffle.DocShuffleIndex`), built once per node."""
        ...


@dataclass(frozen=True, eq=False)
class TokenLayout:
    """Chunk token sums (``cum_tokens``: 0 first, the total last), ``seq_len``,
    ``drop_last``, and the documents on demand (None: a layout without them, e.g. a stream
    block). ``num_windows`` is derived: windows of ``seq_len + 1`` tokens sharing one."""

    cum_tokens: IntArray
    seq_len: int
    drop_last: bool = True
    documents: Documents | None = field(default=None, repr=False)
    num_windows: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        cum = np.asarray(self.cum_tokens, dtype=np.int64).reshape(-1)
        if cum.size == 0 or cum[0] != 0 or (cum.size > 1 and bool((np.diff(cum) < 0).any())):
            raise ConfigError("a token layout's cum_tokens start at 0 and never decrease, "
                              f"got {cum[:8].tolist()}...")
        object.__setattr__(self, "cum_tokens", cum)
        object.__setattr__(self, "num_windows",
                           num_windows(int(cum[-1]), self.seq_len, drop_last=self.drop_last))

    @property
    def total(self) -> int:
        """Tokens of the stored stream."""
        return int(self.cum_tokens[-1])

    @classmethod
    def of_sizes(cls, sizes: npt.ArrayLike, seq_len: int, *, drop_last: bool = True
                 ) -> TokenLayout:
        """The layout of chunks of ``sizes`` tokens (a stream block's, in read order)."""
        cum = np.zeros(len(np.asarray(sizes)) + 1, dtype=np.int64)
        np.cumsum(sizes, out=cum[1:])
        return cls(cum, seq_len, drop_last)

    @classmethod
    def of_windows(cls, n: int, seq_len: int) -> TokenLayout:
        """A layout of exactly ``n`` whole windows (what a window order of a stream block
        sees: only their count decides their order)."""
        return cls(np.asarray([0, n * seq_len + 1 if n else 0], dtype=np.int64), seq_len)

    def doc_starts(self) -> IntArray:
        """The stored documents' starts (asked of :attr:`documents` on demand)."""
        return self._documents().starts()

    def doc_shuffle(self, seed: int, epoch: int) -> Any:
        """Epoch ``epoch``'s document-shuffle plan (asked of :attr:`documents`)."""
        return self._documents().shuffle(seed=seed, epoch=epoch, seq_len=self.seq_len,
                                         drop_last=self.drop_last)

    def _documents(self) -> Documents:
        if self.documents is None:
            raise ConfigError("this token layout has no documents (a stream block's): "
                              "an order of documents needs a whole cache's")
        return self.documents


__all__ = ["Documents", "TokenLayout"]
