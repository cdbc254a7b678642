"""``shardwise bench trace``: ``trace`` of one step on a cache of 100M documents, beside
reading the same step's tokens (the baseline) in the same run. Goal: < 100 ms a step.

The cache is synthesised with the format functions, not built from text (a build of
100M documents takes hours): ``--documents`` documents in chunks of ``--chunk-docs``,
each chunk of one segment of a fake JSONL source (``--sources`` sources), every
chunk's ``.bin``/``.idx`` a hard link to one file of ``--chunk-docs`` documents of 1 to
2,000 tokens (geometric, mean ~600), so 100M documents and ~60G tokens cost ~30 MB of
disk; every chunk has its own ``.json`` (its stem, source, line range), and one in
seven lists a skipped line. ``trace`` reads only ``.idx`` and ``.json`` files and the
ledger, never tokens, so the shared bytes change nothing it measures. Kept under
``--tmp-dir`` and reused by later runs.

Rounds (``--repeat``): a fresh :class:`Tracer` over the cache opened once (opening reads
the whole ledger: its time is printed apart) traces a random step — its *first* step,
which also reads the ledger once for the source lines — then another random step (the
figure: every example's rank, micro-batch, pieces, source file and line; its chunks
were not touched before), then reads that step's examples with
``TokenDataset.get_batch`` (the baseline: what the loader does at that step).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.bench import add_common
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import ChunkKind, ChunkMeta, SourceRange, chunk_stem
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import Manifest, SourceInfo, TokenizerInfo, manifest_checksum
from shardwise.format.megatron import idx_bytes

TARGET_MS = 100.0
SKIP_EVERY = 7


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """Register ``trace`` on ``shardwise bench``'s subcommands."""
    p = which.add_parser("trace", help="trace of one step on a cache of 100M documents")
    p.add_argument("--documents", type=int, default=100_000_000,
                   help="documents in the synthesised cache (default 100M)")
    p.add_argument("--chunk-docs", type=int, default=10_000, help="documents per chunk")
    p.add_argument("--sources", type=int, default=100, help="fake source files (100)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per example (2048)")
    p.add_argument("--global-batch", type=int, default=256, help="examples per step (256)")
    p.add_argument("--micro-batch", type=int, default=4, help="micro-batch size (4)")
    p.add_argument("--world", type=int, default=8, help="ranks (8)")
    add_common(p, repeat=7, repeat_help="steps traced")
    return p


def synth_cache(root: Path, documents: int, chunk_docs: int, sources: int) -> Path:
    """The cache described in the module docs (reused when ``root`` already holds it)."""
    if (root / "ledger.json").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(1 / 600, size=chunk_docs), 2000).astype(np.int64)
    tokens = rng.integers(0, 1000, size=int(lengths.sum()), dtype=np.uint16)
    shared = {".bin": tokens.tobytes(), ".idx": idx_bytes(lengths, tokens.dtype)}
    (root / "chunks").mkdir(exist_ok=True)
    for suffix, data in shared.items():
        (root / "chunks" / f"shared{suffix}").write_bytes(data)
    files = {s: {"bytes": len(d), "xxh3_64": bytes_checksum(d)} for s, d in shared.items()}
    n_chunks = -(-documents // chunk_docs)
    per_source = -(-n_chunks // sources)
    progress = [_source(root, s, range(s * per_source, min((s + 1) * per_source, n_chunks)),
                        chunk_docs, int(lengths.sum()), files)
                for s in range(sources) if s * per_source < n_chunks]
    for suffix in shared:
        (root / "chunks" / f"shared{suffix}").unlink()
    Manifest(TokenizerInfo("bench", 1000, None), "uint16", ChunkKind.TOKENS.value,
             {"kind": "synthetic"}, {"max_docs": chunk_docs},
             [SourceInfo(f"/data/source-{s:03d}.jsonl", 0, "", "jsonl")
              for s in range(len(progress))]).save(LocalFiles(root))
    Ledger(progress, manifest_xxh3=manifest_checksum(LocalFiles(root))).save(LocalFiles(root))
    return root


def _source(root: Path, s: int, chunks: range, docs: int, tokens: int,
            files: dict[str, Any]) -> SourceProgress:
    """One fake source: a segment per chunk, ``docs`` lines each (one in ``SKIP_EVERY``
    with one more line, skipped), the chunk files hard links to the shared ones."""
    segments, pos = [], 0
    for g, c in enumerate(chunks):
        skip = [3] if c % SKIP_EVERY == 0 else None
        lines = docs + (1 if skip else 0)
        stem = chunk_stem(s, g, 0)
        meta = ChunkMeta(stem, ChunkKind.TOKENS, s, f"/data/source-{s:03d}.jsonl", g, 0,
                         docs, tokens, SourceRange("byte", pos, pos + 100 * lines, 0, lines),
                         files, skipped_lines=skip).to_json()
        base = root / stem
        base.parent.mkdir(parents=True, exist_ok=True)
        for suffix in files:
            os.link(root / "chunks" / f"shared{suffix}", f"{base}{suffix}")
        Path(f"{base}.json").write_bytes(meta)
        segments.append(Segment(pos, pos + 100 * lines, pos + 100 * lines, lines, True,
                                [ChunkEntry(stem, docs, tokens, bytes_checksum(meta))],
                                {"invalid_json": 1} if skip else {}))
        pos += 100 * lines
    return SourceProgress(segments)


def _rounds(args: argparse.Namespace, cache: Any) -> list[dict[str, float]]:
    from shardwise.read.config import ReadConfig
    from shardwise.read.trace import Tracer

    cfg = ReadConfig.from_dict({"cache": str(cache.root), "seq_len": args.seq_len,
                                "global_batch_size": args.global_batch,
                                "micro_batch_size": args.micro_batch,
                                "world_size": args.world})
    rng = np.random.default_rng(1)
    out = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tracer = Tracer(cfg, caches={str(cache.root): cache})  # fresh, the cache open
        n_steps = len(tracer.dataset) // args.global_batch
        first, step = (int(x) for x in rng.integers(0, n_steps, size=2))
        t1 = time.perf_counter()
        tracer.step(first)  # reads the ledger once
        t2 = time.perf_counter()
        got = tracer.step(step)  # other chunks: nothing cached for them
        t3 = time.perf_counter()
        tracer.dataset.get_batch([e.position for e in got.examples])
        t4 = time.perf_counter()
        out.append({"setup_ms": 1e3 * (t1 - t0), "first_ms": 1e3 * (t2 - t1),
                    "trace_ms": 1e3 * (t3 - t2), "read_ms": 1e3 * (t4 - t3),
                    "pieces": sum(len(e.pieces) for e in got.examples)})
    return out


def run(args: argparse.Namespace) -> int:
    from shardwise.storage.opening import open_cache

    base = Path(args.tmp_dir or tempfile.gettempdir())
    root = base / f"shardwise-bench-trace-{args.documents}-{args.chunk_docs}-{args.sources}"
    t = time.perf_counter()
    synth_cache(root, args.documents, args.chunk_docs, args.sources)
    made = time.perf_counter() - t
    t = time.perf_counter()
    cache = open_cache(root, verify=False)
    opened = time.perf_counter() - t
    rounds = _rounds(args, cache)
    med = {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}
    best = {k: float(min(r[k] for r in rounds)) for k in rounds[0]}
    result = {"documents": cache.num_documents, "chunks": len(cache.chunks),
              "tokens": cache.num_tokens, "synth_s": made, "open_cache_s": opened,
              "median": med, "best": best, "target_ms": TARGET_MS,
              "trace_vs_read": med["trace_ms"] / med["read_ms"]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"cache: {cache.num_documents:,} documents, {len(cache.chunks):,} chunks, "
              f"{cache.num_tokens:,} tokens (synthesised in {made:.1f} s, opened in "
              f"{opened:.2f} s)")
        print(f"trace of one step ({args.global_batch} examples of {args.seq_len} tokens, "
              f"{med['pieces']:.0f} pieces): median {med['trace_ms']:.1f} ms, best "
              f"{best['trace_ms']:.1f} ms (goal < {TARGET_MS:.0f} ms)")
        print(f"a fresh tracer: setup {med['setup_ms']:.1f} ms, its first step (reads the "
              f"ledger) {med['first_ms']:.1f} ms")
        print(f"reading the same step's tokens (get_batch): median {med['read_ms']:.1f} ms; "
              f"trace / read = {result['trace_vs_read']:.2f}")
    return 0 if med["trace_ms"] < TARGET_MS else 1
