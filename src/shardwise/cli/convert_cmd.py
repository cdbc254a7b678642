"""``shardwise convert``: a cache to one Megatron ``.bin/.idx`` pair, or back.

Thin shell over :func:`shardwise.writer.convert.to_megatron` and
:func:`shardwise.writer.megatron_import.from_megatron`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

import orjson

from shardwise.cli.args import count_arg, positive_float
from shardwise.writer.convert import ConvertSummary, DataPath, megatron_data_path, to_megatron
from shardwise.writer.megatron_import import from_megatron
from shardwise.writer.numpy_import import from_numpy

USAGE = ("shardwise convert DIR --to-megatron PREFIX [--allow-partial] [--no-verify]\n"
         "       shardwise convert DIR --megatron-data-path [--seq-len N]\n"
         "       shardwise convert --from-megatron PREFIX --out DIR "
         "[--chunk-docs N | --chunk-mb N]\n"
         "       shardwise convert --from-numpy FILE [FILE ...] --eos ID [--dtype DTYPE] "
         "--out DIR [--chunk-docs N | --chunk-mb N]")


DESCRIPTION = ("Merge a finished cache's chunks, in global order, into one Megatron PREFIX.bin "
               "+ PREFIX.idx (streamed, constant memory); or import a Megatron prefix as a "
               "chunked, checksummed shardwise cache; or import OLMo's token arrays (documents "
               "ended by an EOS id) as one.")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert", usage=USAGE, help="convert a cache to Megatron .bin/.idx, or import one",
        description=textwrap.fill(DESCRIPTION, 88),
        epilog="examples:\n  shardwise convert cache/ --to-megatron out/corpus_text_document\n"
               "  shardwise convert --from-megatron data/corpus_text_document --out cache/ "
               "--chunk-docs 100000\n"
               "  shardwise convert --from-numpy part-0.npy part-1.npy --eos 100257 "
               "--dtype uint32 --out cache/\n"
               "  pretrain_gpt.py --data-path $(shardwise convert cache/ --megatron-data-path)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="DIR", nargs="?", help="the cache to convert (--to-megatron)")
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to-megatron", metavar="PREFIX",
                           help="write PREFIX.bin and PREFIX.idx from the cache DIR")
    direction.add_argument("--megatron-data-path", action="store_true",
                           help="print the cache's chunks as a weighted --data-path list for "
                                "Megatron's own builder (windows never span its chunks: "
                                "--seq-len N counts what that loses)")
    direction.add_argument("--from-megatron", metavar="PREFIX",
                           help="import PREFIX.bin/PREFIX.idx into a new cache (needs --out)")
    direction.add_argument("--from-numpy", metavar="FILE", nargs="+",
                           help="import token arrays (OLMo's/Dolma's: .npy, or raw with "
                                "--dtype), documents split after each --eos id, into a new "
                                "cache (needs --out)")
    p.add_argument("--eos", metavar="ID", type=count_arg(0),
                   help="with --from-numpy: the EOS id that ends each document (kept)")
    p.add_argument("--dtype", metavar="DTYPE", choices=["uint16", "uint32", "int32", "int64"],
                   help="with --from-numpy: the dtype of raw arrays (no .npy header)")
    p.add_argument("--out", metavar="DIR",
                   help="new cache directory for --from-megatron / --from-numpy")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--chunk-docs", metavar="N", type=count_arg(1),
                      help="documents per chunk (--from-megatron)")
    size.add_argument("--chunk-mb", metavar="N", type=positive_float,
                      help="close a chunk once it holds N MiB of tokens (--from-megatron; "
                           "default 64)")
    p.add_argument("--seq-len", metavar="N", type=count_arg(1),
                   help="with --megatron-data-path: count the windows of N + 1 tokens that "
                        "packing per chunk loses")
    p.add_argument("--allow-partial", action="store_true",
                   help="convert the visible prefix of a cache still being built")
    p.add_argument("--no-verify", action="store_true",
                   help="with --to-megatron: copy the chunks without checking their checksums "
                        "(faster on a cache you trust; a flipped bit is copied silently)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(_convert_parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    error = _usage_error(args)
    if error:
        args._convert_parser.error(error)  # exits 2 with the usage line
    if args.megatron_data_path:
        _print_data_path(megatron_data_path(args.path, seq_len=args.seq_len,
                                            allow_partial=args.allow_partial), args.json)
        return 0
    if args.to_megatron:
        summary = to_megatron(args.path, args.to_megatron, allow_partial=args.allow_partial,
                              verify=not args.no_verify)
    elif args.from_numpy:
        summary = from_numpy(args.from_numpy, args.out, eos=args.eos, dtype=args.dtype,
                             chunk_docs=args.chunk_docs, chunk_mb=args.chunk_mb or 64)
    else:
        summary = from_megatron(args.from_megatron, args.out, chunk_docs=args.chunk_docs,
                                chunk_mb=args.chunk_mb or 64)
    _print(summary, args.json, "Megatron prefix" if args.to_megatron else "cache")
    return 0


def _usage_error(args: argparse.Namespace) -> str | None:
    """The combinations argparse groups cannot express, by direction."""
    if args.seq_len is not None and not args.megatron_data_path:
        return "--seq-len applies only to --megatron-data-path"
    if args.no_verify and not args.to_megatron:
        return "--no-verify applies only to --to-megatron"
    if (args.eos is not None or args.dtype) and not args.from_numpy:
        return f"--{'eos' if args.eos is not None else 'dtype'} applies only to --from-numpy"
    if args.from_numpy and args.eos is None:
        return "--from-numpy needs --eos ID (the token id that ends each document)"
    if args.to_megatron or args.megatron_data_path:
        if not args.path:
            flag = "--to-megatron PREFIX" if args.to_megatron else "--megatron-data-path"
            return f"{flag} needs the cache directory DIR"
        bad = [f for f in ("out", "chunk_docs", "chunk_mb") if getattr(args, f) is not None]
        if bad:
            return f"--{bad[0].replace('_', '-')} applies only to --from-megatron"
        return None
    flag = "--from-numpy FILE" if args.from_numpy else "--from-megatron PREFIX"
    if args.path:
        return f"{flag.split()[0]} takes no DIR argument (got {args.path!r}); use --out DIR"
    if not args.out:
        return f"{flag} needs --out DIR (the new cache directory)"
    if args.allow_partial:
        return "--allow-partial applies only to --to-megatron"
    return None


def _print(s: ConvertSummary, as_json: bool, what: str) -> None:
    if as_json:
        print(orjson.dumps(s.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    print(f"wrote {what} {s.path}: {s.chunks:,} chunks, {s.documents:,} documents, "
          f"{s.tokens:,} tokens ({s.dtype}, {s.bytes:,} token bytes) in {s.seconds:.2f}s")
    for note in s.notes:
        print(f"note: {note}")


def _print_data_path(d: DataPath, as_json: bool) -> None:
    """The list alone on stdout (for ``--data-path $(...)``); the accounting on stderr."""
    if as_json:
        print(orjson.dumps(d.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    print(" ".join(d.items))
    print(f"{d.chunks:,} chunk prefixes, {d.tokens:,} tokens", file=sys.stderr)
    if d.lost_windows:
        print(f"note: Megatron packs each prefix alone: {d.windows_per_chunk:,} windows of "
              f"{d.seq_len} + 1 tokens instead of {d.windows:,} ({d.lost_windows:,} lost "
              "where chunks end); 'shardwise convert DIR --to-megatron PREFIX' (one prefix) "
              "or shardwise.megatron's datasets lose none", file=sys.stderr)
