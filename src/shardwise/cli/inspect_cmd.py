"""``shardwise inspect``: what a cache (or a Megatron prefix) holds, at a glance.

Thin shell over :func:`shardwise.storage.summary.summarize`: prints sources, totals, build
status, skipped records and a histogram of document lengths; ``--json`` for machines,
``--plot`` for a PNG, ``--examples`` to eyeball the packed windows a model will see. Given
a read config (``read.json``) it shows the blend's schedule and planned mix instead
(:mod:`shardwise.cli.inspect_schedule`).
"""

from __future__ import annotations

import argparse
import operator
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from shardwise.cli import inspect_schedule
from shardwise.cli.args import count_arg
from shardwise.errors import ConfigError, MissingExtraError
from shardwise.format.chunk import ChunkKind
from shardwise.plan.windows import dropped_tokens, num_windows
from shardwise.storage.cache import Cache
from shardwise.storage.opening import open_cache
from shardwise.storage.summary import CacheSummary, sample_lengths, summarize

BAR_WIDTH = 40


DESCRIPTION = ("Summarise a shardwise cache directory or a Megatron dataset prefix "
               "(data/corpus_text_document for .bin/.idx): sources, totals, build status, "
               "skipped records by reason and a histogram of document lengths (sampled for "
               "huge caches).")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "inspect", help="show what a cache holds: sources, totals, status, document lengths",
        description=textwrap.fill(DESCRIPTION, 88),
        epilog="examples:\n  shardwise inspect cache/\n  shardwise inspect cache/ --json\n"
               "  shardwise inspect cache/ --plot lengths.png\n"
               "  shardwise inspect cache/ --examples 2 --seq-len 16 --tokenizer tok.json\n"
               "  shardwise inspect read.json --plot mix.svg   # a blend schedule's mix",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="DIR", help="cache directory, Megatron prefix, or cache URL "
                   "(s3://bucket/prefix; chunk files are downloaded to ~/.cache/shardwise); "
                   "or a read config (.json): its blend schedule and planned mix")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", metavar="FILE.png", type=Path,
                   help="write a PNG: document length distribution and tokens per source "
                        "(needs matplotlib: pip install 'shardwise[plot]'); for a read "
                        "config, FILE.svg: the planned mix over steps (no library needed)")
    p.add_argument("--steps", metavar="N", type=count_arg(1), default=None,
                   help="read config: chart the first N steps (default: a quarter past "
                        "the last stage's start)")
    p.add_argument("--examples", metavar="N", type=count_arg(0), default=0,
                   help="print the first N packed windows of SEQ_LEN+1 tokens")
    p.add_argument("--seq-len", metavar="L", type=count_arg(1), default=None,
                   help="window length: how many windows of L+1 tokens a TokenDataset cuts "
                        "and how many tokens its last partial window drops; also the "
                        "length of --examples")
    p.add_argument("--tokenizer", metavar="FILE", type=Path, default=None,
                   help="tokenizer.json to decode --examples (default: print token ids)")
    p.add_argument("--sample-docs", metavar="N", type=count_arg(1), default=1_000_000,
                   help="read at most about N document lengths (default: %(default)s)")
    p.add_argument("--no-verify", action="store_true",
                   help="trust the cache: do not checksum the chunks --examples reads nor "
                        "check their token ids against the vocabulary")
    return p


def run(args: argparse.Namespace) -> int:
    if inspect_schedule.is_read_config(str(args.path)):
        return inspect_schedule.run(args)
    if args.examples and args.seq_len is None:
        raise ConfigError("--examples N needs --seq-len L (windows of L+1 tokens)")
    cache = open_cache(args.path, verify=not args.no_verify)
    summary = summarize(cache, sample_docs=args.sample_docs)
    examples = packed_examples(cache, args.examples, args.seq_len or 0, args.tokenizer)
    windows = window_report(cache, args.seq_len)
    if args.plot is not None:
        write_plot(cache, summary, args.plot, sample_docs=args.sample_docs)
    if args.json:
        out = summary.to_dict()
        if windows is not None:
            out["windows"] = windows
        if args.examples:
            out["examples"] = examples
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0
    print("\n".join(render(summary)))
    if windows is not None:
        print("\n" + window_line(windows))
    for i, ex in enumerate(examples):
        print(f"\nexample {i} (tokens {ex['start']}..{ex['stop']}):\n{ex['text']}")
    if args.examples and len(examples) < args.examples:
        print(f"\nonly {len(examples)} complete windows of {args.seq_len + 1} tokens "
              f"in {cache.num_tokens} visible tokens")
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0


def render(s: CacheSummary) -> list[str]:
    """The human report, one line per element."""
    lines = [f"{s.layout} cache {s.path}",
             f"  chunks: {s.chunk_kind}, dtype {s.dtype}, tokenizer {s.tokenizer}, "
             f"vocab {_n(s.vocab_size)}, eod {s.eod_id}",
             f"  status: {s.status}; visible: {s.visible_chunks:,} chunks, "
             f"{s.visible_documents:,} documents, {s.visible_tokens:,} tokens", "", "sources:"]
    for i, src in enumerate(s.sources):
        state = "finished" if src.finished else "building"
        errs = sum(src.errors.values())
        lines.append(f"  [{i}] {src.path} ({src.format}, {_bytes(src.size)}): {src.chunks:,} "
                     f"chunks, {src.documents:,} documents{_empty(src.empty)}, "
                     f"{src.tokens:,} tokens, {state}, {errs:,} skipped")
    lines.append(f"totals: {len(s.sources)} sources, {s.chunks:,} chunks, {s.documents:,} "
                 f"documents{_empty(s.empty_documents)}, {s.tokens:,} tokens")
    if s.errors:
        lines.append("skipped records: " + ", ".join(f"{k} {v:,}" for k, v in s.errors.items()))
    else:
        lines.append("skipped records: none")
    return lines + ["", *histogram_lines(s)]


def window_report(cache: Cache, seq_len: int | None) -> dict[str, Any] | None:
    """What ``TokenDataset(cache, seq_len=L)`` cuts from the visible tokens: its windows
    and the tokens after the last full one, which ``drop_last=True`` (the default) drops
    and ``drop_last=False`` pads and masks. ``None`` without ``--seq-len`` or for a
    record (Parquet) cache, which a TokenDataset does not read."""
    if seq_len is None or cache.chunks.kind is not ChunkKind.TOKENS:
        return None
    t = cache.num_tokens
    return {"seq_len": seq_len, "tokens": t,
            "windows": num_windows(t, seq_len, drop_last=True),
            "dropped_tokens": dropped_tokens(t, seq_len, drop_last=True),
            "windows_padded": num_windows(t, seq_len, drop_last=False)}


def window_line(w: dict[str, Any]) -> str:
    """The human line of :func:`window_report`."""
    head = (f"with --seq-len {w['seq_len']}: {w['windows']:,} windows of "
            f"{w['seq_len'] + 1} tokens; ")
    if not w["dropped_tokens"]:
        return head + f"no token dropped ({w['tokens']:,} tokens fill them exactly)"
    share = 100 * w["dropped_tokens"] / w["tokens"]
    return (head + f"the last {w['dropped_tokens']:,} of {w['tokens']:,} tokens ({share:.2g}%) "
            f"are dropped (drop_last=True; drop_last=False pads and masks them: "
            f"{w['windows_padded']:,} windows)")


def histogram_lines(s: CacheSummary) -> list[str]:
    """Log2 buckets of document lengths as bars of █ scaled to ``BAR_WIDTH`` columns."""
    st = s.lengths
    if not st.documents:
        return ["document lengths: no documents"]
    scope = f"a sample of {st.documents:,}" if st.sampled else f"all {st.documents:,}"
    lines = [f"document lengths in tokens ({scope} documents; min {st.min:,}, median "
             f"{st.median:,.0f}, mean {st.mean:,.1f}, p99 {st.p99:,.0f}, max {st.max:,}):"]
    top = max(c for _, _, c in st.buckets)
    for lo, hi, count in st.buckets:
        bar = "█" * (round(BAR_WIDTH * count / top) if count else 0)
        if count and not bar:
            bar = "▏"
        lines.append(f"  {lo:>9,} – {hi:>9,} │{bar:<{BAR_WIDTH}} {count:>10,} "
                     f"({100 * count / st.documents:5.1f}%)")
    return lines


def packed_examples(cache: Cache, n: int, seq_len: int, tokenizer: Path | None
                    ) -> list[dict[str, Any]]:
    """The first ``n`` windows of ``seq_len + 1`` tokens (consecutive windows share one
    token), decoded with ``tokenizer`` if given; the chunks they come from are checked
    first (ids, and checksums once per node) unless the cache was opened with
    ``verify=False``."""
    if n == 0:
        return []
    decode = _decoder(tokenizer)
    out = []
    for i in range(n):
        start, stop = i * seq_len, i * seq_len + seq_len + 1
        if stop > cache.num_tokens:
            break
        window = cache.read_tokens(start, stop)
        cache.checks.ids(window, partial(operator.add, start))
        ids = [int(t) for t in window]
        out.append({"start": start, "stop": stop, "ids": ids,
                    "text": decode(ids) if decode else " ".join(map(str, ids))})
    cache.wait_for_verify()  # the chunks read: checksummed before anything is shown
    cache.raise_if_damaged()
    return out


def _decoder(path: Path | None) -> Any:
    if path is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def write_plot(cache: Cache, s: CacheSummary, path: Path, *, sample_docs: int) -> None:
    """Two panels: document length distribution (log x) and tokens per source."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install 'shardwise[plot]'"
                                ) from None
    import numpy as np

    lengths, _ = sample_lengths(cache, sample_docs)
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas, without touching pyplot's global state
    left, right = fig.subplots(1, 2)
    positive = lengths[lengths > 0]
    if len(positive):
        bins = np.logspace(0, np.log2(max(int(positive.max()), 2)) + 0.01, 40, base=2)
        left.hist(positive, bins=bins, color="#3b75af")
        left.set_xscale("log", base=2)
    left.set_xlabel("document length (tokens)")
    left.set_ylabel("documents" + (" (sample)" if s.lengths.sampled else ""))
    left.set_title(f"document lengths ({s.lengths.documents:,} documents)")
    names = [Path(src.path).name or src.path for src in s.sources]
    right.bar(range(len(names)), [src.tokens for src in s.sources], color="#e1812c")
    right.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("tokens")
    right.set_title(f"tokens per source ({s.tokens:,} in all)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)


def _empty(n: int) -> str:
    return f" ({n:,} empty)" if n else ""


def _n(v: int | None) -> str:
    return "unknown" if v is None else f"{v:,}"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
