"""``shardwise bench build --bucket URL``: each build again with the corpus and the cache in
a bucket, beside the same build from and to local disk, in the same rounds with the same
workers (and the same executor: with ``--executor ray``, Ray's tasks read the corpus from
the bucket by ranged GETs and publish their chunks to it, as on a cluster whose nodes
share no filesystem). "vs disk" is the bucket build's MB/s over the disk build's.

The corpus is uploaded once to ``URL/corpus.jsonl``; each build writes
``URL/cache-<round>-<workers>``, which is hashed (its token files must equal the disk
build's) and removed. Credentials and endpoint come from the environment
(``AWS_ENDPOINT_URL``…), as for any build.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from shardwise.remote.client import RemoteStore


def add_bucket_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bucket", default=None, metavar="URL",
                        help="also build from and to this bucket prefix (s3://b/bench), "
                             "beside every disk build, with the ratio (vs disk)")


def upload_corpus(path: Path, url: str) -> str:
    """``path`` copied to ``url/corpus.jsonl``; its URL."""
    store = RemoteStore(url)
    if store.list_keys():
        from shardwise.errors import ConfigError

        raise ConfigError(f"--bucket {url}: not empty; give an empty or new prefix (the "
                          "bench writes and removes its corpus and caches there)")
    store.put("corpus.jsonl", path.read_bytes())
    return store.url_of("corpus.jsonl")


def remove_prefix(url: str) -> None:
    store = RemoteStore(url)
    store.remove(store.list_keys())


def token_digest(files: dict[str, bytes]) -> str:
    """A hash of a cache's token files (``.bin``, ``.idx``): equal for a build from a
    bucket and from disk (their metadata differ in the source's name only)."""
    import xxhash

    h = xxhash.xxh3_128()
    for name in sorted(n for n in files if n.endswith((".bin", ".idx"))):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    return h.hexdigest()


def measure_bucket_build(corpus_url: str, tokenizer: Path, workers: int, out: str,
                         executor: Any = None, chunk_mb: float | None = None
                         ) -> dict[str, Any]:
    """:func:`shardwise.bench.build.measure_build` from and to the bucket."""
    from shardwise.bench.build import _cpu_seconds
    from shardwise.writer.api import build

    cpu, started = _cpu_seconds(), time.perf_counter()
    summary = build([corpus_url], out, tokenizer=tokenizer, workers=workers, progress=False,
                    executor=executor, chunk_mb=chunk_mb)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu + getattr(executor, "task_cpu_seconds", 0.0)
    store = RemoteStore(out)
    keys = store.list_keys()
    files = {k: store.get(k) for k in keys if k.endswith((".bin", ".idx"))}
    store.remove(keys)
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": summary.tokens,
            "digest": token_digest(files)}


__all__ = ["add_bucket_argument", "measure_bucket_build", "remove_prefix", "token_digest",
           "upload_corpus"]
