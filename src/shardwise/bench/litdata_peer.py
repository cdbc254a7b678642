"""LitData, the peer the read benches compare with: the same tokens in its own format, and
its readers as litgpt uses them (``StreamingDataset`` + ``TokensLoader``).

:func:`write_tokens` writes token arrays (a shardwise cache's chunks: :func:`cache_chunks`)
as LitData chunks, one per array, with LitData's own ``BinaryWriter`` — the files
``litdata.optimize(..., item_loader=TokensLoader())`` makes — into a local directory,
which a remote bench uploads as it is. :func:`dataset` and :func:`loader` read a local
directory or a URL (``s3://…``; ``cache_dir`` is where LitData downloads to).

Their orders' randomness differ (the bench says so beside each figure): LitData cuts each
chunk into blocks of ``seq_len + 1`` tokens (none across a chunk edge; consecutive blocks
share no token) and, with ``shuffle=True``, permutes the chunks, then the blocks *within*
each chunk (one chunk read at a time); shardwise's default permutes every window of the
whole corpus (a keyed permutation), so consecutive examples come from anywhere.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import MissingExtraError

# --no-deps: litdata requires torchvision, whose newest release pulls another torch
LITDATA_INSTALL = ("pip install --no-deps litdata==0.2.76 && "
                   "pip install lightning-utilities boto3 filelock obstore")
ORDER = ("LitData: chunks permuted, then blocks of seq_len+1 permuted within each chunk "
         "(one chunk at a time)")


def require() -> str:
    """LitData's version; a :class:`MissingExtraError` with the install line if it is not
    importable (the CLI turns it into exit 2 and that line)."""
    try:
        from importlib.metadata import version

        import litdata  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything else
        raise MissingExtraError(f"--peer litdata needs LitData ({type(e).__name__}: {e}): "
                                f"{LITDATA_INSTALL}") from None
    return version("litdata")


def cache_chunks(cache: Any) -> Iterator[npt.NDArray[Any]]:
    """A shardwise cache's token chunks, in stored order (arrays in the stored dtype)."""
    for c in range(len(cache.chunks)):
        yield np.asarray(cache.tokens(c))


def write_tokens(arrays: Iterable[npt.NDArray[Any]], out_dir: str | Path) -> dict[str, Any]:
    """Each array as one LitData chunk of ``out_dir`` (its dtype kept: uint16 stays 2 bytes
    a token), with the ``index.json`` LitData reads; the files and token counts."""
    import torch
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.writer import BinaryWriter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = chunks = 0
    with _quiet():
        writer = BinaryWriter(str(out), chunk_size=1, item_loader=TokensLoader())
        for i, a in enumerate(arrays):
            writer.add_item(i, torch.from_numpy(np.array(a)))  # writable: a copy
            tokens, chunks = tokens + len(a), chunks + 1
        writer.done()
        writer.merge()
    return {"dir": str(out), "chunks": chunks, "tokens": tokens,
            "bytes": sum(p.stat().st_size for p in out.glob("*.bin"))}


def dataset(input_dir: str | Path, *, seq_len: int, seed: int, shuffle: bool = True,
            cache_dir: str | Path | None = None, **options: Any) -> Any:
    """``StreamingDataset(input_dir, item_loader=TokensLoader(seq_len + 1), ...)``: litgpt's
    pretraining dataset (``options``: any other of its arguments)."""
    from litdata import StreamingDataset, TokensLoader

    with _quiet():
        return StreamingDataset(str(input_dir), item_loader=TokensLoader(block_size=seq_len + 1),
                                shuffle=shuffle, seed=seed,
                                cache_dir=None if cache_dir is None else str(cache_dir),
                                **options)


def loader(ds: Any, *, batch_size: int, num_workers: int = 0, **options: Any) -> Any:
    """``StreamingDataLoader`` over ``ds``: litgpt's loader (``[batch, seq_len + 1]``)."""
    from litdata import StreamingDataLoader

    return StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers, **options)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """LitData prints and logs as it writes; keep a bench report clean."""
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(level)


__all__ = ["LITDATA_INSTALL", "ORDER", "cache_chunks", "dataset", "loader", "require",
           "write_tokens"]
