"""``shardwise bench stream``: stream placement's sustained examples/s and RSS, beside the
global-placement loader on the same cache in the same run, then while a build runs.

1. A cache: ``--cache DIR``, or built here from the bundled sample (or ``--corpus``)
   repeated to ``--mb`` MB of text, in small chunks (``--chunk-docs``).
2. Finished cache, ``--repeat`` interleaved rounds of ``--seconds`` each (the best round
   of each reader is kept; RSS is sampled all along)::

       round r:  global (TokenDataset + shardwise.torch.loader) │ stream (StreamDataset)

   Both yield micro-batches of ``--micro-batch`` torch tensors to one consumer (rank 0 of
   1, no DataLoader workers): the stream through ``DataLoader(ds, batch_size=None)`` with
   the dataset's own ``batch_size``. The chunk cache (``--chunk-cache-mb``) is smaller
   than the data by default, so the stream keeps reading chunks as it cycles.
3. Follow: a build of the same corpus in a subprocess into a new directory and, started
   together, a single-pass ``follow=True`` reader; its examples/s over the whole build,
   and the seconds it waited on the producer (and on its own prefetch thread).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from shardwise.bench import add_common, add_inputs, check_counts
from shardwise.bench.child import memory_mb
from shardwise.bench.text_corpus import MB, make_corpus, read_texts, resolve_inputs
from shardwise.errors import ConfigError, MissingExtraError

TARGET_VS_GLOBAL = 0.8


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """Register ``stream`` on ``shardwise bench``'s subcommands."""
    p = which.add_parser("stream", help="examples/s and RSS of stream placement vs the "
                                         "global loader, and while a build runs")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="a finished token cache to read (default: build one from --corpus; "
                        "the follow figure needs --corpus/--tokenizer or the sample)")
    add_inputs(p, corpus="JSONL with a 'text' field, repeated to --mb")
    p.add_argument("--mb", type=float, default=32.0, help="MB of text to build (default 32)")
    p.add_argument("--chunk-docs", type=int, default=256,
                   help="documents per chunk of the built cache (default 256)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per example (2048)")
    p.add_argument("--streams", type=int, default=8, help="R*, streams (default 8)")
    p.add_argument("--block-chunks", type=int, default=4, help="chunks per block (4)")
    p.add_argument("--micro-batch", type=int, default=8, help="examples per batch (8)")
    p.add_argument("--chunk-cache-mb", type=float, default=8.0,
                   help="the stream's chunk cache in MiB (default 8)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per round (5)")
    p.add_argument("--no-follow", action="store_true", help="skip the concurrent build")
    add_common(p, repeat=3, repeat_help="interleaved rounds")
    return p


def rss_bytes() -> int:
    """This process's resident set size now (:func:`~shardwise.bench.child.memory_mb`)."""
    mem = memory_mb()
    return int(mem.get("rss_mb", mem["peak_mb"]) * 2**20)


def _timed(batches: Any, seconds: float, rss: list[int]) -> dict[str, float]:
    """Consume ``batches`` for ``seconds``; examples/s, sampling RSS every 64 batches."""
    it = iter(batches)
    next(it)  # first batch: start-up, not sustained throughput
    n = examples = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        examples += len(next(it)["input_ids"])
        n += 1
        if n % 64 == 0:
            rss.append(rss_bytes())
    return {"examples": examples, "seconds": elapsed, "examples_per_s": examples / elapsed}


def _readers(cache: Path, args: argparse.Namespace) -> tuple[Any, Any]:
    try:
        from torch.utils.data import DataLoader

        from shardwise.torch import loader
    except ImportError as e:
        raise MissingExtraError("bench stream compares torch loaders: "
                                "pip install 'shardwise[torch]'") from e
    from shardwise.read.stream.dataset import StreamDataset
    from shardwise.read.tokens.dataset import TokenDataset
    from shardwise.world import World

    world, mb = World(0, 1), args.micro_batch
    glob = loader(TokenDataset(cache, seq_len=args.seq_len, seed=1), global_batch_size=mb,
                  micro_batch_size=mb, world=world)
    stream = StreamDataset(cache, seq_len=args.seq_len, streams=args.streams, seed=1,
                           world=world, block_chunks=args.block_chunks, batch_size=mb,
                           chunk_cache_bytes=int(args.chunk_cache_mb * (1 << 20)))
    return glob, (stream, DataLoader(cast(Any, stream), batch_size=None))


def measure_finished(cache: Path, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    glob, (stream, stream_dl) = _readers(cache, args)
    runs: dict[str, list[dict[str, float]]] = {"global": [], "stream": []}
    rss: dict[str, list[int]] = {"global": [], "stream": []}
    for r in range(args.repeat):
        for name, batches in (("global", glob), ("stream", stream_dl)):
            runs[name].append(_timed(batches, args.seconds, rss[name]))
            log(f"  round {r + 1}/{args.repeat}: {name:<6} "
                f"{runs[name][-1]['examples_per_s']:,.0f} examples/s")
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        best = max(rs, key=lambda x: x["examples_per_s"])
        samples = rss[name] or [rss_bytes()]
        out[name] = {**best, "runs": [x["examples_per_s"] for x in rs],
                     "rss_first_mb": samples[0] / MB, "rss_last_mb": samples[-1] / MB,
                     "rss_max_mb": max(samples) / MB, "examples_total":
                     sum(x["examples"] for x in rs)}
    out["stream"]["chunk_cache"] = stream.chunk_cache.stats()
    out["stream"]["chunks_read"] = sum(stream.opened.values())
    out["stream"]["chunks_in_cache"] = len(stream.cache.chunks)
    out["ratio"] = out["stream"]["examples_per_s"] / out["global"]["examples_per_s"]
    stream.close()
    return out


def measure_follow(corpus: Path, tokenizer: Path, out: Path, args: argparse.Namespace
                   ) -> dict[str, Any]:
    """A build subprocess and a follow reader started together; the reader's figures."""
    from shardwise.read.stream.dataset import StreamDataset
    from shardwise.world import World

    code = ("import sys; from shardwise.writer.api import build; "
            "build([sys.argv[1]], sys.argv[2], tokenizer=sys.argv[3], workers=1, "
            f"chunk_docs={args.chunk_docs}, progress=False)")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(corpus), str(out), str(tokenizer)])
    try:
        ds = StreamDataset(out, seq_len=args.seq_len, streams=args.streams, seed=1,
                           world=World(0, 1), block_chunks=args.block_chunks,
                           batch_size=args.micro_batch, follow=True, epochs=1,
                           poll_interval=0.05, timeout=120,
                           chunk_cache_bytes=int(args.chunk_cache_mb * (1 << 20)))
        examples = real = 0
        rss = [rss_bytes()]
        for n, batch in enumerate(ds, 1):
            examples += len(batch["input_ids"])
            real += int(batch["loss_mask"].any(axis=1).sum())
            if n % 64 == 0:
                rss.append(rss_bytes())
        seconds = time.perf_counter() - started
    finally:
        code_ = proc.wait()
    if code_ != 0:
        raise ConfigError(f"the concurrent build failed (exit {code_})")
    stats = ds.stats()
    ds.close()
    return {"examples": examples, "real_examples": real, "seconds": seconds,
            "examples_per_s": examples / seconds, "producer_wait_s": stats["producer_wait_s"],
            "consumer_wait_s": stats["consumer_wait_s"], "chunks": len(ds.cache.chunks),
            "rss_first_mb": rss[0] / MB, "rss_max_mb": max(rss) / MB}


def format_report(rep: dict[str, Any]) -> str:
    f, g, s = rep["finished"], rep["finished"]["global"], rep["finished"]["stream"]
    lines = [f"shardwise bench stream: {rep['cache']} ({rep['tokens']:,} tokens, "
             f"{rep['chunks']} chunks); seq_len {rep['seq_len']}, {rep['streams']} streams, "
             f"micro-batch {rep['micro_batch']}, best of {rep['repeat']} x "
             f"{rep['seconds']:g} s rounds",
             "", f"  {'':<34}{'examples/s':>12}{'RSS first':>11}{'last':>8}{'max MB':>8}"]
    for name, x in (("global: TokenDataset + loader", g), ("stream: StreamDataset", s)):
        lines.append(f"  {name:<34}{x['examples_per_s']:>12,.0f}{x['rss_first_mb']:>11.0f}"
                     f"{x['rss_last_mb']:>8.0f}{x['rss_max_mb']:>8.0f}")
    cc = s["chunk_cache"]
    lines += [f"  stream / global: {f['ratio']:.2f}x (target >= {TARGET_VS_GLOBAL}x: "
              f"{'ok' if f['ratio'] >= TARGET_VS_GLOBAL else 'MISSED'}); the stream read "
              f"{s['chunks_read']} chunks ({s['chunks_in_cache']} in the cache) through a "
              f"{cc['max_bytes'] / MB:.1f} MB chunk cache, peak {cc['peak_bytes'] / MB:.1f} MB"]
    fo = rep.get("follow")
    if fo:
        lines += ["", f"  follow, during a build: {fo['examples']:,} examples "
                      f"({fo['real_examples']:,} real) from {fo['chunks']} chunks in "
                      f"{fo['seconds']:.1f} s = {fo['examples_per_s']:,.0f} examples/s; "
                      f"waited on the producer {fo['producer_wait_s']:.1f} s, on prefetch "
                      f"{fo['consumer_wait_s']:.1f} s; RSS {fo['rss_first_mb']:.0f} -> max "
                      f"{fo['rss_max_mb']:.0f} MB"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``shardwise bench stream``: make or open the cache, measure, print."""
    check_counts(args, repeat=1, micro_batch=1, seq_len=1, streams=1, chunk_docs=1)
    if not (args.mb > 0 and args.seconds > 0 and args.chunk_cache_mb >= 0):
        raise ConfigError("--mb and --seconds must be positive, --chunk-cache-mb >= 0")
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    from shardwise.storage.opening import open_cache
    from shardwise.writer.api import build

    with tempfile.TemporaryDirectory(prefix="shardwise-bench-", dir=args.tmp_dir) as tmp:
        work = Path(tmp)
        corpus = tokenizer = None
        if args.cache is None or not args.no_follow:
            source, tokenizer = resolve_inputs(args.corpus, args.tokenizer)
            corpus = make_corpus(read_texts(source, int(args.mb * MB)), args.mb,
                                 work / "corpus.jsonl").path
        cache = Path(args.cache) if args.cache else work / "cache"
        if args.cache is None:
            log(f"shardwise bench stream: building {args.mb:g} MB of text into {cache}")
            build([str(corpus)], cache, tokenizer=tokenizer, workers=2,
                  chunk_docs=args.chunk_docs, progress=False)
        opened = open_cache(cache)
        report: dict[str, Any] = {"cache": str(cache), "tokens": opened.num_tokens,
                                  "chunks": len(opened.chunks), "seq_len": args.seq_len,
                                  "streams": args.streams, "micro_batch": args.micro_batch,
                                  "repeat": args.repeat, "seconds": args.seconds}
        report["finished"] = measure_finished(cache, args, log)
        if not args.no_follow:
            assert corpus is not None and tokenizer is not None  # for mypy: made above
            log("  follow: a build and a follow=True reader, started together")
            report["follow"] = measure_follow(corpus, tokenizer, work / "growing", args)
    report["target_ok"] = report["finished"]["ratio"] >= TARGET_VS_GLOBAL
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["add_subparser", "run"]
