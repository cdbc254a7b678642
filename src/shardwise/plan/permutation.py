"""Keyed pseudo-random permutations of ``range(n)``, evaluated per index in O(1) memory.

Why: the global order of an epoch is ``π_e(i)`` for every example ``i``. Materialising
``π_e`` costs 8 bytes per example per epoch (gigabytes at billions of examples) and start-up
time; a keyed bijection computed per index costs neither, so any epoch and any position is
as cheap as the first. A linear congruential map ``(a*i + b) % n`` would also be O(1), but
its constant stride leaks the stored order; a Feistel network does not.

How (version 1, pinned by a golden file):

1. *Domain.* ``2**(2h)``, the smallest power of two with an even number of bits that is
   ``>= n`` (``h >= 1``), split into two balanced ``h``-bit halves. It is at most ``4n``.
2. *Rounds.* ``ROUNDS = 6`` Feistel rounds ``(L, R) -> (R, L ^ F_r(R))`` with
   ``F_r(R) = mix64(R ^ k_r) & (2**h - 1)``; ``mix64`` is the splitmix64 finaliser on
   wrapping ``uint64``. A Feistel network is a bijection whatever ``F`` is, so strength
   only matters for how random the order looks, not for correctness.
3. *Keys.* ``k_0..k_5`` are the first 48 bytes (six little-endian ``uint64``) of
   ``sha512(f"shardwise.permutation.v1:seed={seed}:epoch={epoch}:tag={tag}")``;
   ``Permutation`` uses ``tag=""``. ``permute_within`` derives one key set per group ``g``
   as ``mix64(k_r + (g + 1) * 0x9E3779B97F4A7C15)``.
4. *Cycle walking.* Apply the network until the value lands in ``[0, n)``. Starting
   inside ``[0, n)`` this restricts a bijection of the domain to a bijection of
   ``[0, n)``; the expected number of steps is below 4 and vectorised calls only iterate
   the elements still out of range.

Worked example (``Permutation(n=5, seed=1, epoch=0)``: domain ``2**4 = 16``, ``h = 2``)::

    i     network applied until the value is < 5     π(i)
    0     6 -> 14 -> 2                                2
    1     10 -> 7 -> 4                                4
    2     5 -> 12 -> 11 -> 15 -> 3                    3
    3     9 -> 0                                      0
    4     1                                           1

so ``π = [2, 4, 3, 0, 1]``; ``inverse`` walks the inverse network the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import (
    IndexLike,
    IntArray,
    as_index_array,
    check_in_range,
    check_int,
    unwrap,
)

PERMUTATION_VERSION: int = 1
"""Recorded in checkpoints; bump whenever any output of this module changes."""

ROUNDS = 6
MAX_N = 2**62
_M64 = 0xFFFF_FFFF_FFFF_FFFF
_GAMMA = 0x9E37_79B9_7F4A_7C15

U64 = npt.NDArray[np.uint64]


def mix64(x: Any) -> Any:
    """splitmix64's finaliser: a bijective avalanche of a ``uint64`` (int or uint64 array).

    Array products wrap modulo ``2**64``; callers run it under
    ``np.errstate(over="ignore")`` so numpy scalars wrap silently too.
    """
    x = ((x ^ (x >> 30)) * 0xBF58_476D_1CE4_E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D0_49BB_1331_11EB) & _M64
    return x ^ (x >> 31)


def derive_seed(seed: int, *tags: int | str) -> int:
    """A 63-bit seed for an independent sub-stream of ``seed`` (e.g. ``"doc_shuffle"``).

    Two plans that would otherwise share ``(seed, epoch)`` (a document shuffle and a
    window shuffle over similar ``n``) take different derived seeds, so their orders are
    unrelated.
    """
    text = ":".join(["shardwise.seed", str(check_int(seed, "seed")), *map(str, tags)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def round_keys(seed: int, epoch: int, tag: str = "") -> tuple[int, ...]:
    """The ``ROUNDS`` Feistel keys for ``(seed, epoch, tag)`` (see the module docstring)."""
    text = f"shardwise.permutation.v{PERMUTATION_VERSION}:seed={seed}:epoch={epoch}:tag={tag}"
    digest = hashlib.sha512(text.encode()).digest()
    return tuple(int.from_bytes(digest[8 * r: 8 * r + 8], "little") for r in range(ROUNDS))


def half_bits(n: int) -> int:
    """``h``: the domain is ``2**(2h)``, the smallest even-bit power of two ``>= n``."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _half_bits_array(sizes: IntArray) -> U64:
    """``half_bits`` for every element (float estimate, then exact integer correction)."""
    s = np.maximum(sizes, 2).astype(np.uint64)
    bits = np.ceil(np.log2(s.astype(np.float64))).astype(np.uint64)
    one = np.uint64(1)
    bits = np.where((one << (bits - one)) >= s, bits - one, bits)
    bits = np.where((one << bits) < s, bits + one, bits)
    return (bits + one) >> one


def _feistel(x: Any, keys: Sequence[Any], h: Any, mask: Any, *, inverse: bool) -> Any:
    """One pass of the network over ``2h``-bit values (ints or uint64 arrays)."""
    left, right = x >> h, x & mask
    if not inverse:
        for k in keys:
            left, right = right, left ^ (mix64(right ^ k) & mask)
    else:
        for k in reversed(keys):
            left, right = right ^ (mix64(left ^ k) & mask), left
    return (left << h) | right


def _select(a: Any, rows: npt.NDArray[np.intp]) -> Any:
    """``a[rows]`` for per-element arrays; scalars broadcast unchanged."""
    return a[rows] if isinstance(a, np.ndarray) and a.ndim else a


def _walk(x: U64, n: Any, keys: Sequence[Any], h: Any, *, inverse: bool) -> U64:
    """Cycle-walk ``x`` (all inside ``[0, n)``) through the network back into ``[0, n)``."""
    one = np.uint64(1)
    mask = (one << h) - one
    with np.errstate(over="ignore"):
        out = _feistel(x, keys, h, mask, inverse=inverse)
        todo = np.flatnonzero(out >= n)
        while todo.size:
            val = _feistel(out[todo], [_select(k, todo) for k in keys], _select(h, todo),
                           _select(mask, todo), inverse=inverse)
            out[todo] = val
            todo = todo[val >= _select(n, todo)]
    return out


def _walk_int(x: int, n: int, keys: Sequence[int], h: int, *, inverse: bool) -> int:
    """``_walk`` for one Python int: same arithmetic, no array overhead (~10x faster)."""
    mask = (1 << h) - 1
    x = _feistel(x, keys, h, mask, inverse=inverse)
    while x >= n:
        x = _feistel(x, keys, h, mask, inverse=inverse)
    return int(x)


@dataclass(frozen=True)
class Permutation:
    """The keyed bijection ``π`` of ``range(n)`` for ``(seed, epoch)``.

    >>> p = Permutation(n=10, seed=1234, epoch=0)
    >>> sorted(p(np.arange(10))) == list(range(10)) and p.inverse(p(7)) == 7
    True
    """

    n: int
    seed: int
    epoch: int
    _keys: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _h: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.n, "Permutation n", minimum=0, maximum=MAX_N)
        check_int(self.seed, "Permutation seed")
        check_int(self.epoch, "Permutation epoch", minimum=0)
        object.__setattr__(self, "_keys", round_keys(int(self.seed), int(self.epoch)))
        object.__setattr__(self, "_h", half_bits(int(self.n)))

    @overload
    def __call__(self, idx: int) -> int: ...
    @overload
    def __call__(self, idx: npt.ArrayLike) -> IntArray: ...

    def __call__(self, idx: IndexLike) -> int | IntArray:
        """``π(idx)``, elementwise; the result has the shape of ``idx``."""
        return self._apply(idx, inverse=False)

    @overload
    def inverse(self, idx: int) -> int: ...
    @overload
    def inverse(self, idx: npt.ArrayLike) -> IntArray: ...

    def inverse(self, idx: IndexLike) -> int | IntArray:
        """``π⁻¹(idx)``: the position at which value ``idx`` appears."""
        return self._apply(idx, inverse=True)

    def _apply(self, idx: IndexLike, *, inverse: bool) -> int | IntArray:
        arr, scalar = as_index_array(idx, "Permutation index")
        check_in_range(arr, self.n, f"Permutation(n={self.n})")
        if self.n <= 1:
            return unwrap(arr.copy(), scalar)
        if scalar:
            return _walk_int(int(arr[0]), self.n, self._keys, self._h, inverse=inverse)
        x = arr.reshape(-1).astype(np.uint64)
        out = _walk(x, np.uint64(self.n), [np.uint64(k) for k in self._keys],
                    np.uint64(self._h), inverse=inverse)
        return unwrap(out.astype(np.int64).reshape(arr.shape), scalar)


def permutation(n: int, *, seed: int, epoch: int) -> IntArray:
    """``π`` materialised as an array (tests and small ``n`` only: it is O(n) memory)."""
    return Permutation(n, seed, epoch)(np.arange(n, dtype=np.int64))


def permute_within(idx: npt.ArrayLike, sizes: npt.ArrayLike, groups: npt.ArrayLike, *,
                   seed: int, epoch: int, tag: str) -> IntArray:
    """Apply an independent keyed permutation of ``range(sizes[i])`` to each ``idx[i]``.

    Element ``i`` belongs to group ``groups[i]``; every group has its own key, derived from
    ``(seed, epoch, tag)`` and the group number, so elements of one group are permuted
    among themselves. Used for the windows inside a block-shuffle group and the chunks
    inside a stream's block. Example: sizes ``[3, 3, 3, 2, 2]``, groups ``[0, 0, 0, 1, 1]``,
    idx ``[0, 1, 2, 0, 1]`` gives a reordering of ``0..2`` followed by one of ``0..1``.
    """
    x, _ = as_index_array(idx, "permute_within idx")
    n, _ = as_index_array(sizes, "permute_within sizes")
    g, _ = as_index_array(groups, "permute_within groups")
    x, n, g = (a.reshape(-1) for a in np.broadcast_arrays(x, n, g))
    if x.size and (x.min() < 0 or (x >= n).any() or n.max() > MAX_N):
        raise ValueError("permute_within: every idx must be in [0, size) with size <= 2**62")
    base = round_keys(check_int(seed, "seed"), check_int(epoch, "epoch", minimum=0), tag)
    gu = g.astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        keys = [mix64(np.uint64(k) + gu * np.uint64(_GAMMA)) for k in base]
    if n.size and n.min() == n.max():  # the common case: one size, scalar shifts are faster
        size, h = np.uint64(n[0]), np.uint64(half_bits(int(n[0])))
        out = _walk(x.astype(np.uint64), size, keys, h, inverse=False)
    else:
        out = _walk(x.astype(np.uint64), n.astype(np.uint64), keys, _half_bits_array(n),
                    inverse=False)
    return out.astype(np.int64)
