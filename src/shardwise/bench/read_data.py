"""The data ``shardwise bench read`` reads, and the peer it is compared with.

Corpora are random uint16 tokens (vocab 50k, every document ending in the end-of-document
id 0) with log-normal document lengths (median 400, mean ~820 tokens, like web text),
written once as a Megatron ``.bin/.idx`` and reused while their ``.json`` says they were
made alike. The same tokens are also imported as a chunked shardwise cache, so the bench
shows the reader on the layout a build makes (windows spread over many chunk files) beside
the one-file layout Megatron reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ShardwiseError

VOCAB = 50_000
EOD = 0
DATA_VERSION = 1
MEGATRON_INSTALL = "pip install --no-deps megatron-core==0.16.1"


def doc_lengths(tokens: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Log-normal document lengths (median 400) in [16, 65536], summing to ``tokens``."""
    parts, total = [], 0
    while total < tokens:
        x = np.clip(np.rint(rng.lognormal(np.log(400), 1.2, 65_536)), 16, 65_536)
        parts.append(x.astype(np.int64))
        total += int(parts[-1].sum())
    lengths = np.concatenate(parts)
    last = int(np.searchsorted(np.cumsum(lengths), tokens))
    lengths = lengths[: last + 1]
    lengths[-1] -= int(lengths.sum()) - tokens
    return lengths


def make_corpus(prefix: Path, tokens: int, seed: int) -> dict[str, Any]:
    """Write ``prefix.bin/.idx`` (reused when its ``.json`` says it was made alike)."""
    from shardwise.format.megatron import idx_bytes

    meta_path = prefix.with_name(prefix.name + ".json")
    want = {"version": DATA_VERSION, "tokens": tokens, "seed": seed, "vocab": VOCAB}
    bin_path = prefix.with_name(prefix.name + ".bin")
    if meta_path.is_file() and bin_path.is_file() and bin_path.stat().st_size == 2 * tokens:
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in want} == want:
            return {**meta, "made_s": 0.0, "reused": True}
    meta_path.unlink(missing_ok=True)  # written last: its presence means complete files
    started = time.perf_counter()
    rng = np.random.default_rng([seed, tokens])
    lengths = doc_lengths(tokens, rng)
    ends = np.cumsum(lengths) - 1
    block = 1 << 24
    with open(bin_path, "wb") as f:
        for s in range(0, tokens, block):
            ids = rng.integers(1, VOCAB, size=min(block, tokens - s), dtype=np.uint16)
            e = ends[(ends >= s) & (ends < s + len(ids))] - s
            ids[e] = EOD
            f.write(ids.tobytes())
    prefix.with_name(prefix.name + ".idx").write_bytes(idx_bytes(lengths, np.uint16))
    meta = {**want, "prefix": str(prefix), "documents": len(lengths),
            "mean_doc": float(lengths.mean()), "median_doc": float(np.median(lengths))}
    meta_path.write_text(json.dumps(meta))
    return {**meta, "made_s": time.perf_counter() - started, "reused": False}


def chunked_copy(prefix: Path, chunks: int) -> tuple[Path, int]:
    """``prefix`` imported as a shardwise cache of about ``chunks`` chunks (reused when one
    of that size is there, written by a build that records block sums: ranged reads of
    an older one are off); its directory and chunk count."""
    from shardwise.storage.opening import open_cache
    from shardwise.writer.megatron_import import from_megatron

    token_bytes = prefix.with_name(prefix.name + ".bin").stat().st_size
    chunk_mb = max(token_bytes / chunks / (1 << 20), 0.01)
    out = prefix.with_name(f"{prefix.name}.cache-{chunks}")
    with contextlib.suppress(OSError, ShardwiseError):  # absent or damaged: import again
        cache = open_cache(out)
        if (cache.finished and cache.num_tokens * 2 == token_bytes
                and "block_xxh3_64" in cache.store.meta(0).files[".bin"]):
            return out, len(cache.chunks)
    shutil.rmtree(out, ignore_errors=True)
    summary = from_megatron(prefix, out, chunk_mb=chunk_mb)
    return out, summary.chunks


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Megatron-Core warns and logs at import and construction; keep the report clean."""
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(level)


def megatron_dataset(prefix: Path, seq_len: int, seed: int, cache_dir: Path,
                     now: Callable[[], float] = time.perf_counter
                     ) -> tuple[Any, dict[str, Any]]:
    """Megatron-Core's GPTDataset over ``prefix`` (None and a note when unavailable).

    ``info["first_example_s"]``: construction (its shuffled index built, or loaded from
    ``cache_dir``) and its first example, timed with ``now`` after the imports."""
    info: dict[str, Any] = {"available": False}
    try:
        with quiet():
            from importlib.metadata import version

            from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
            from megatron.core.datasets.indexed_dataset import IndexedDataset
            from megatron.core.datasets.utils import Split
            info["version"] = version("megatron-core")
    except Exception as e:  # ImportError, or a broken install raising anything else
        info["note"] = (f"megatron.core is not importable ({type(e).__name__}: {e}); "
                        f"for the baseline: {MEGATRON_INSTALL}")
        return None, info

    class StubTokenizer:  # what GPTDataset reads of a tokenizer
        eod, pad, vocab_size = EOD, VOCAB + 1, VOCAB
        unique_identifiers = {"class": "StubTokenizer", "eod": EOD, "pad": VOCAB + 1}

    try:
        with quiet():
            config = GPTDatasetConfig(
                random_seed=seed, sequence_length=seq_len, blend=None,
                split="1,0,0", tokenizer=StubTokenizer(), reset_position_ids=False,
                reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
                path_to_cache=str(cache_dir), mmap_bin_files=True)
            started = now()
            low = IndexedDataset(str(prefix), multimodal=False, mmap=True)
            docs = np.arange(len(low.sequence_lengths), dtype=np.int32)
            ds = GPTDataset(low, str(prefix), docs, None, Split.train, config)
            info["index_build_s"] = now() - started
            ds[0]  # warm up (lazy loads), as the shardwise paths are warmed
            info["first_example_s"] = now() - started
    except Exception as e:  # an incompatible megatron-core version
        info["note"] = (f"megatron-core {info['version']} GPTDataset failed "
                        f"({type(e).__name__}: {e}); the bench targets {MEGATRON_INSTALL}")
        return None, info
    info.update(available=True, examples=len(ds), note="GPTDataset(create_attention_mask="
                "False): tokens, labels, loss_mask, position_ids, as shardwise returns")
    return ds, info


__all__ = ["DATA_VERSION", "EOD", "MEGATRON_INSTALL", "VOCAB", "chunked_copy", "doc_lengths",
           "make_corpus", "megatron_dataset", "quiet"]
