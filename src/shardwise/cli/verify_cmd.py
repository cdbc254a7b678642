"""``shardwise verify``: check every chunk of a cache; exit 1 if anything is damaged.

Thin shell over :func:`shardwise.storage.verify.verify_cache` (or ``verify_megatron`` for a
Megatron prefix): one ``BAD <path>: <what>`` line per problem, ``NOTE`` lines for files the
ledger does not name, and a summary line. ``--json`` prints the report as one object.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

import orjson

from shardwise.errors import ConfigError, ManifestError
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME, Manifest
from shardwise.remote.client import is_url
from shardwise.storage.opening import open_store
from shardwise.storage.verify import verify_cache, verify_megatron, verify_remote
from shardwise.storage.verify_quick import verify_quick
from shardwise.storage.verify_report import VerifyReport
from shardwise.writer.convert import IMPORT_KIND

DESCRIPTION = ("Check a shardwise cache exhaustively: the manifest, the ledger's consistency, "
               "and for every chunk the ledger names (visible or not) its metadata checksum, "
               "every data file's size and xxh3_64, the .idx structure and Parquet row counts. "
               "Every damaged file is named. For a Megatron prefix, checks the .idx header and "
               "structure and the .bin size.")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "verify", help="check every chunk's checksums and structure; exit 1 if damaged",
        description=textwrap.fill(DESCRIPTION, 88),
        epilog="examples:\n  shardwise verify cache/\n  shardwise verify data/corpus_text_document"
               "\n  shardwise verify cache/ --json\n  shardwise verify cache/ --quick"
               "\n  shardwise verify s3://bucket/cache",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="DIR", help="cache directory, Megatron prefix, or cache URL "
                   "(s3://bucket/prefix; credentials from the environment)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--quick", action="store_true",
                   help="headers and sizes only, of the visible chunks: no hashing, no "
                        "metadata file read (seconds for 100,000 chunks; finds missing, "
                        "truncated and mislabelled files, not flipped bits)")
    return p


def run(args: argparse.Namespace) -> int:
    if is_url(args.path):
        if args.quick:
            raise ConfigError("--quick checks a local cache directory; verify a cache on "
                              "an object store without --quick")
        report = verify_remote(args.path)
    else:
        report = check(Path(args.path), quick=args.quick)
    if args.json:
        print(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        for p in report.problems:
            print(f"BAD {p.path}: {p.what}")
        for p in report.notes:
            print(f"NOTE {p.path}: {p.what}")
        print(summary_line(report, rebuild=_how_to_rebuild(args.path)))
    return 0 if report.ok else 1


def _how_to_rebuild(path: str) -> str | None:
    """What rebuilds damaged chunks in place: a rerun of the build that made the cache;
    nothing for a Megatron prefix or a cache imported from one (restore those)."""
    if not is_url(path) and not Path(path).is_dir():
        return None  # a Megatron prefix
    try:
        kind = Manifest.load(open_store(path)).processor.get("kind")
    except ManifestError:
        return "rerun the same build command"  # unreadable manifest: advised separately
    return None if kind == IMPORT_KIND else "rerun the same build command"


def check(path: Path, *, quick: bool = False) -> VerifyReport:
    """A cache directory, or else a Megatron prefix (always checked whole: one ``.idx``);
    anything else is a usage error."""
    if path.is_dir():
        return verify_quick(path) if quick else verify_cache(path)
    if any(path.with_name(path.name + s).is_file() for s in (".bin", ".idx")):
        return verify_megatron(path)
    if path.suffix in (".bin", ".idx"):
        return verify_megatron(path.with_suffix(""))
    raise ManifestError(f"{path}: neither a cache directory (with {MANIFEST_NAME}) nor a "
                        f"Megatron prefix ({path.name}.bin / {path.name}.idx)")


def summary_line(r: VerifyReport, *, rebuild: str | None = None) -> str:
    """``rebuild``: the command that rebuilds damaged chunks in place, if any."""
    checked = (f"{r.chunks_checked:,} chunks checked (headers and sizes only: --quick)"
               if r.quick else f"{r.chunks_checked:,} chunks, {r.bytes_checked:,} bytes checked")
    extra = f"; {len(r.notes)} notes" if r.notes else ""
    if r.ok:
        return f"OK {r.root}: {checked}{extra}"
    files = len({p.path for p in r.problems})
    return (f"FAILED {r.root}: {len(r.problems)} problems in {files} files; {checked}{extra}; "
            + advice(r, rebuild))


def advice(r: VerifyReport, rebuild: str | None) -> str:
    """What will repair it, and only what will: a rerun of the build rebuilds damaged
    chunks (shardwise.writer.repair), never a damaged manifest or ledger."""
    head = r.root.rstrip("/") + "/"
    names = {p.path[len(head):] if p.path.startswith(head) else p.path for p in r.problems}
    chunks = {n.rsplit(".", 1)[0] for n in names if n.startswith("chunks/")}
    others = sorted(n for n in names if not n.startswith("chunks/") and n != INDEX_NAME)
    if rebuild is None:
        return "restore the named files from a copy"
    if not others and not chunks:  # only the ledger's index, which every build rewrites
        return f"{rebuild}: it rewrites {INDEX_NAME} (readers ignore it until then)"
    if not others:
        n = len(chunks)
        return (f"{rebuild}: it checks every chunk and rebuilds the {n} damaged "
                f"chunk{'s' if n != 1 else ''}, byte-identical (or restore "
                f"{'them' if n != 1 else 'it'} from a copy)")
    return (f"{', '.join(others)} cannot be repaired by rerunning the build: restore "
            f"{'it' if len(others) == 1 else 'them'} from a copy, or build the cache again "
            "with --overwrite")
