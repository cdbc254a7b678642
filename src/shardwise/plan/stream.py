"""Stream placement: ``R*`` virtual readers, each owning every ``R*``-th chunk.

Why: with remote storage, or a producer still writing the cache, a rank should read whole
chunks it owns, in order, and never wait on another rank. Fixing the number of *streams*
``R*`` (not ranks) makes the global order independent of the world size ``R``, as long as
``R`` divides ``R*``: each rank simply serves ``R* / R`` streams (any other ``R`` is
served too, by ranks sharing streams: :class:`~shardwise.world.StreamShare`).

* stream ``s`` owns the chunks ``c`` with ``c % R* == s``;
* example ``i`` of the global order is example ``i // R*`` of stream ``i % R*``;
* rank ``r`` serves the streams ``s`` with ``s % R == r``, and its ``j``-th example is
  global example ``j*R + r``.

Worked example (``R* = 4`` streams, ``R = 2`` ranks, 10 chunks)::

    stream   0: chunks 0 4 8   1: 1 5 9   2: 2 6   3: 3 7
    global   i = 0 1 2 3 4 5 6 7 ...  from streams 0 1 2 3 0 1 2 3 ...
    rank 0   streams 0, 2  reads i = 0 2 4 6 ...  (j-th example = global 2j)
    rank 1   streams 1, 3  reads i = 1 3 5 7 ...

``R = 4`` is the ``chunk_idx % world_size == rank`` layout. Inside a stream, chunks are
shuffled within consecutive blocks of ``block_chunks`` (keyed by seed, epoch, stream): a
block's order is final once the block is full, so a reader following a growing cache
never reorders chunks it has already read. A block's documents are packed into windows
(:func:`windows_per_block`) that never cross the block, read in a seeded order
(:func:`window_order`), so a follower never waits for the next block to finish a window.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import (
    IndexLike,
    IntArray,
    as_position_array,
    check_int,
    unwrap,
)
from shardwise.plan.permutation import permute_within
from shardwise.world import World

STREAM_TAG = "stream_chunks"
WINDOW_TAG = "stream_windows"


def streams_per_rank(world: int, n_streams: int) -> int:
    """How many streams each rank reads: ``R* / gcd(R, R*)`` (``R* / R`` when ``R``
    divides ``R*``; the rule is :class:`shardwise.world.StreamShare`)."""
    w = check_int(world, "world size", minimum=1)
    return len(World(0, w).streams(check_int(n_streams, "n_streams", minimum=1)))


def streams_of_rank(rank: int, world: int, n_streams: int) -> IntArray:
    """The streams rank ``rank`` reads, ascending: ``s % gcd(R, R*) == rank % gcd``
    (``s % world == rank`` when ``world`` divides ``n_streams``)."""
    w = check_int(world, "world size", minimum=1)
    r = check_int(rank, "rank", minimum=0, maximum=w - 1)
    return np.asarray(sorted(World(r, w).streams(n_streams)), dtype=np.int64)


def chunks_of_stream(s: int, n_chunks: int, n_streams: int) -> IntArray:
    """The global chunk indices stream ``s`` owns, in stored order."""
    n = check_int(n_streams, "n_streams", minimum=1)
    stream = check_int(s, "stream", minimum=0, maximum=n - 1)
    return np.arange(stream, check_int(n_chunks, "n_chunks", minimum=0), n, dtype=np.int64)


@overload
def global_to_stream(i: int, n_streams: int) -> tuple[int, int]: ...
@overload
def global_to_stream(i: npt.ArrayLike, n_streams: int) -> tuple[IntArray, IntArray]: ...


def global_to_stream(i: IndexLike,
                     n_streams: int) -> tuple[int, int] | tuple[IntArray, IntArray]:
    """Global example ``i`` -> ``(stream, example within the stream)``."""
    arr, scalar = as_position_array(i, "global example")
    stream = arr % check_int(n_streams, "n_streams", minimum=1)
    k = arr // n_streams
    if scalar:
        return int(stream.reshape(-1)[0]), int(k.reshape(-1)[0])
    return stream, k


@overload
def stream_to_global(s: int, k: int, n_streams: int) -> int: ...
@overload
def stream_to_global(s: npt.ArrayLike, k: npt.ArrayLike, n_streams: int) -> IntArray: ...


def stream_to_global(s: IndexLike, k: IndexLike, n_streams: int) -> int | IntArray:
    """Example ``k`` of stream ``s`` -> its global example index ``k * R* + s``."""
    n = check_int(n_streams, "n_streams", minimum=1)
    ss, s_scalar = as_position_array(s, "stream")
    kk, k_scalar = as_position_array(k, "stream example")
    if ss.size and ss.max() >= n:
        raise ValueError(f"stream must be in [0, {n}), got {ss.max()}")
    return unwrap(kk * n + ss, s_scalar and k_scalar)


@overload
def rank_example_to_global(j: int, rank: int, world: int) -> int: ...
@overload
def rank_example_to_global(j: npt.ArrayLike, rank: int, world: int) -> IntArray: ...


def rank_example_to_global(j: IndexLike, rank: int, world: int) -> int | IntArray:
    """Rank ``rank``'s ``j``-th example -> global example ``j * world + rank``."""
    w = check_int(world, "world size", minimum=1)
    r = check_int(rank, "rank", minimum=0, maximum=w - 1)
    arr, scalar = as_position_array(j, "rank example")
    return unwrap(arr * w + r, scalar)


def shuffled_stream_chunks(s: int, n_chunks: int, n_streams: int, *, seed: int, epoch: int,
                           block_chunks: int) -> IntArray:
    """Stream ``s``'s chunks, shuffled inside consecutive blocks of ``block_chunks``.

    ``block_chunks=1`` keeps stored order; the last block may be short (and is reshuffled
    as it fills). Example with ``block_chunks=2``: chunks ``[0 4 8 12 16]`` become e.g.
    ``[4 0 | 8 12 | 16]``.
    """
    chunks = chunks_of_stream(s, n_chunks, n_streams)
    bc = check_int(block_chunks, "block_chunks", minimum=1)
    pos = np.arange(chunks.size, dtype=np.int64)
    block = pos // bc
    size = np.minimum(bc, chunks.size - block * bc)
    inner = permute_within(pos % bc, size, block, seed=seed, epoch=epoch,
                           tag=f"{STREAM_TAG}.{s}")
    return chunks[block * bc + inner]


def stream_chunk_tokens(cum_tokens: IntArray, s: int, n_streams: int, start: int = 0
                        ) -> IntArray:
    """Token counts of stream ``s``'s visible chunks, from its ``start``-th chunk on."""
    idx = np.arange(s + start * n_streams, len(cum_tokens) - 1, n_streams)
    return cum_tokens[idx + 1] - cum_tokens[idx]


def windows_per_block(chunk_tokens: npt.ArrayLike, block_chunks: int, seq_len: int,
                      drop_last: bool) -> IntArray:
    """Windows of each block, given a stream's chunk token counts from a block start.

    Example: tokens ``[5, 4, 9]``, ``block_chunks=2``, ``seq_len=4`` → blocks of 9 and 9
    tokens → ``[2, 2]`` windows (``drop_last``), ``[2, 2]`` padded too (``(9-1)/4 = 2``).
    """
    toks = np.asarray(chunk_tokens, dtype=np.int64)
    if toks.size == 0:
        return np.zeros(0, dtype=np.int64)
    sums = np.add.reduceat(toks, np.arange(0, toks.size, block_chunks))
    labels = np.maximum(sums - 1, 0)
    return labels // seq_len if drop_last else (labels + seq_len - 1) // seq_len


def dropped_block_tokens(chunk_tokens: npt.ArrayLike, block_chunks: int, seq_len: int,
                         drop_last: bool) -> int:
    """Tokens of a stream's blocks that no window holds: each block's tail after its last
    full window (``drop_last``), or a block too short for one window.

    Example (the :func:`windows_per_block` one): blocks of 9 and 9 tokens, ``seq_len=4``
    → 2 windows each, holding tokens 0‥8: nothing dropped. Blocks of 13 and 11 tokens →
    3 and 2 windows holding 13 and 9 tokens: 2 dropped (the second block's last two).
    """
    toks = np.asarray(chunk_tokens, dtype=np.int64)
    if toks.size == 0:
        return 0
    sums = np.add.reduceat(toks, np.arange(0, toks.size, block_chunks))
    w = windows_per_block(toks, block_chunks, seq_len, drop_last)
    held = np.where(w > 0, np.minimum(sums, w * seq_len + 1), 0)
    return int((sums - held).sum())


def dropped_stream_tokens(cum_tokens: IntArray, n_streams: int, block_chunks: int,
                          seq_len: int, drop_last: bool, *, full_blocks_only: bool) -> int:
    """:func:`dropped_block_tokens` summed over all ``n_streams`` streams of a cache
    (``cum_tokens``: its chunks' prefix sums). ``full_blocks_only``: leave out each
    stream's last, partial block (not final while a build runs)."""
    lost = 0
    for s in range(n_streams):
        toks = stream_chunk_tokens(cum_tokens, s, n_streams)
        if full_blocks_only:
            toks = toks[: len(toks) // block_chunks * block_chunks]
        lost += dropped_block_tokens(toks, block_chunks, seq_len, drop_last)
    return lost


def block_read_order(s: int, b: int, size: int, *, n_streams: int, block_chunks: int,
                     seed: int, epoch: int) -> IntArray:
    """Global chunks of block ``b`` (``size`` chunks) of stream ``s``, in read order: the
    slice ``[b·block_chunks, b·block_chunks + size)`` of
    :func:`shuffled_stream_chunks`, computed for one block."""
    inner = permute_within(np.arange(size), size, b, seed=seed, epoch=epoch,
                           tag=f"{STREAM_TAG}.{s}") if size > 1 else np.zeros(size, np.int64)
    return s + (b * block_chunks + inner) * n_streams


def window_order(s: int, b: int, n: int, *, seed: int, epoch: int) -> IntArray:
    """The seeded order of block ``b``'s ``n`` windows (keyed by seed, epoch, stream)."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    return permute_within(np.arange(n), n, b, seed=seed, epoch=epoch, tag=f"{WINDOW_TAG}.{s}")
