"""``shardwise bench build``: build throughput for 1..N workers, beside the tokenizer's own
single-thread speed, measured in the same run on the same text.

The corpus is the bundled sample (or ``--corpus``) repeated until it holds ``--mb`` MB
(10^6 bytes) of UTF-8 text, each copy's documents prefixed ``[copy k]`` so no two
documents are equal. Then, ``--repeat`` rounds, interleaved so that a burst of load on a
shared machine hits every figure alike (the best, i.e. shortest, run of each is kept)::

    round r:  tokenizer (fresh process, 1 thread) │ build, 1 worker │ … │ build, N workers

MB/s counts the text bytes (not the JSON around them), so the build and the tokenizer
are compared on the same work. Every build's cache bytes are hashed: they must all be
identical (the cache does not depend on the worker count).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.errors import ConfigError

BATCH = 1024
MB = 1_000_000
TARGET_VS_TOKENIZER = 0.8   # one worker vs the tokenizer alone, one thread
TARGET_EFFICIENCY = 0.8     # N workers vs N × one worker
_SINGLE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Corpus:
    """The JSONL file the bench builds, and what it holds."""

    path: Path
    documents: int
    text_bytes: int
    file_bytes: int
    copies: int


def sample_dir() -> Path | None:
    """``sample/`` of the source tree this package runs from (an editable install), if any."""
    import shardwise

    repo = Path(shardwise.__file__).resolve().parents[2]  # src/shardwise/__init__.py
    d = repo / "sample"
    return d if (d / "corpus.jsonl").is_file() and (d / "tokenizer.json").is_file() else None


def resolve_inputs(corpus: str | None, tokenizer: str | None) -> tuple[Path, Path]:
    """The corpus and tokenizer files: the ones given, else the bundled sample's."""
    sample = sample_dir()
    if sample is None and (corpus is None or tokenizer is None):
        missing = " and ".join(f"--{n} FILE" for n, v in (("corpus", corpus),
                                                           ("tokenizer", tokenizer)) if v is None)
        raise ConfigError("the bundled sample (sample/corpus.jsonl, sample/tokenizer.json in "
                          "the shardwise source tree) is not found: this install has no "
                          f"repository next to it; pass {missing} (a JSONL file with a "
                          "'text' field, a tokenizer.json)")
    paths = (Path(corpus) if corpus else Path(sample or ".", "corpus.jsonl"),
             Path(tokenizer) if tokenizer else Path(sample or ".", "tokenizer.json"))
    for what, p in zip(("corpus", "tokenizer"), paths, strict=True):
        if not p.is_file():
            raise ConfigError(f"{what} file {p} does not exist")
    return paths


def read_texts(path: Path, limit_bytes: int) -> list[str]:
    """The ``text`` fields of a JSONL file, stopping once ``limit_bytes`` of text are read."""
    import orjson

    texts: list[str] = []
    total = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = orjson.loads(line)["text"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}:{n}: expected a JSON object with a string 'text' "
                                  f"field ({type(e).__name__}: {e})") from None
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{path}:{n}: 'text' must be a non-empty string")
            texts.append(text)
            total += len(text.encode("utf-8"))
            if total >= limit_bytes:
                break
    if not texts:
        raise ConfigError(f"{path}: no records with a 'text' field")
    return texts


def make_corpus(texts: list[str], mb: float, out: Path) -> Corpus:
    """Write ``texts`` repeated (``[copy k]`` marks each copy) until ``mb`` MB of text."""
    import orjson

    target = max(1, int(mb * MB))
    docs = text_bytes = copy = 0
    with open(out, "wb") as f:
        while text_bytes < target:
            for t in texts:
                text = f"[copy {copy}] {t}"
                f.write(orjson.dumps({"id": docs, "text": text}) + b"\n")
                docs += 1
                text_bytes += len(text.encode("utf-8"))
                if text_bytes >= target:
                    break
            copy += 1
    return Corpus(out, docs, text_bytes, out.stat().st_size, copy)


def _child_main(corpus: str, tokenizer: str) -> None:
    """In a fresh process with :data:`_SINGLE_THREAD_ENV`: time ``encode_batch`` (or
    ``encode_batch_fast``) over every text in batches of :data:`BATCH`; print JSON."""
    import orjson
    from tokenizers import Tokenizer

    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    tok = Tokenizer.from_file(tokenizer)
    fast = hasattr(tok, "encode_batch_fast")
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(texts), BATCH):
        tokens += sum(len(e.ids) for e in encode(texts[i:i + BATCH], add_special_tokens=False))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "tokens": tokens, "documents": len(texts),
                      "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                      "model": type(tok.model).__name__,
                      "method": "encode_batch_fast" if fast else "encode_batch",
                      "env": {k: os.environ.get(k) for k in _SINGLE_THREAD_ENV}}))


def measure_tokenizer(corpus: Corpus, tokenizer: Path) -> dict[str, Any]:
    """One timed pass of the tokenizer alone, single-threaded, in a fresh interpreter (so
    the environment is set before the Rust thread pool exists)."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **_SINGLE_THREAD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    code = ("import sys; from shardwise.cli.bench_build import _child_main; "
            "_child_main(sys.argv[1], sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", code, str(corpus.path), str(tokenizer)],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"the tokenizer baseline process failed (exit {proc.returncode}):\n"
                          f"{proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def cache_digest(root: Path) -> str:
    """A hash of every file of a cache: relative paths and bytes."""
    import xxhash

    h = xxhash.xxh3_128()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def measure_build(corpus: Corpus, tokenizer: Path, workers: int, out: Path
                  ) -> tuple[float, int, str]:
    """Wall seconds, tokens and the cache digest of one fresh build; the cache is removed."""
    from shardwise.build.api import build

    started = time.perf_counter()
    summary = build([str(corpus.path)], out, tokenizer=tokenizer, workers=workers,
                    progress=False)
    seconds = time.perf_counter() - started
    digest = cache_digest(out)
    shutil.rmtree(out)
    return seconds, summary.tokens, digest


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _figures(seconds: list[float], tokens: int, text_bytes: int) -> dict[str, Any]:
    best = min(seconds)
    return {"seconds": best, "runs": seconds, "tokens": tokens,
            "tokens_per_s": tokens / best, "mb_per_s": text_bytes / MB / best}


def run_rounds(corpus: Corpus, tokenizer: Path, max_workers: int, repeat: int, work: Path,
               log: Any) -> dict[str, Any]:
    """Interleaved rounds of every measurement; the figures and the identity check."""
    tok_runs: list[dict[str, Any]] = []
    build_runs: dict[int, list[float]] = {w: [] for w in range(1, max_workers + 1)}
    build_tokens: dict[int, int] = {}
    digests: set[str] = set()
    for r in range(repeat):
        tok_runs.append(measure_tokenizer(corpus, tokenizer))
        log(f"  round {r + 1}/{repeat}: tokenizer {tok_runs[-1]['seconds']:.2f} s")
        for w in build_runs:
            seconds, tokens, digest = measure_build(corpus, tokenizer, w, work / f"c{r}-{w}")
            build_runs[w].append(seconds)
            build_tokens[w] = tokens
            digests.add(digest)
            log(f"  round {r + 1}/{repeat}: build, {w} worker{'s' * (w > 1)} {seconds:.2f} s")
    first = tok_runs[0]
    tok = _figures([t["seconds"] for t in tok_runs], first["tokens"], corpus.text_bytes)
    tok.update({k: first[k] for k in ("vocab_size", "model", "method", "env")})
    builds = []
    for w, runs in build_runs.items():
        b = {"workers": w, **_figures(runs, build_tokens[w], corpus.text_bytes)}
        builds.append(b)
    one = builds[0]["mb_per_s"]
    for b in builds:
        b["vs_one_worker"] = b["mb_per_s"] / one
        b["efficiency"] = b["vs_one_worker"] / b["workers"]
        b["vs_tokenizer"] = b["mb_per_s"] / tok["mb_per_s"]
    return {"tokenizer": tok, "builds": builds, "identical": len(digests) == 1,
            "distinct_caches": len(digests),
            "tokens_match": all(t == first["tokens"] for t in build_tokens.values())}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's acceptance figures, checked against this run."""
    builds = report["builds"]
    out = [{"what": f"1 worker >= {TARGET_VS_TOKENIZER:.2f}x the tokenizer's single thread",
            "want": TARGET_VS_TOKENIZER, "got": builds[0]["vs_tokenizer"]}]
    for b in builds[1:]:
        want = TARGET_EFFICIENCY * b["workers"]
        out.append({"what": f"{b['workers']} workers >= {want:.2f}x 1 worker", "want": want,
                    "got": b["vs_one_worker"]})
    for t in out:
        t["ok"] = t["got"] >= t["want"]
    return out


def format_report(report: dict[str, Any]) -> str:
    c, t, m = report["corpus"], report["tokenizer"], report["machine"]
    lines = [
        f"shardwise bench build: {c['text_bytes'] / MB:.1f} MB of text in {c['documents']:,} "
        f"documents ({c['file_bytes'] / MB:.1f} MB of JSONL, {c['copies']} copies of "
        f"{c['source']}), {t['tokens']:,} tokens",
        f"  tokenizer {report['tokenizer_path']} ({t['model']}, vocab {t['vocab_size']:,}), "
        f"{t['method']} in batches of {BATCH}",
        f"  cores: {m['usable_cores']} usable of {m['cpu_count']}; best of {report['repeat']} "
        "interleaved runs each; MB = 10^6 bytes of text",
        "",
        f"  {'':<24}{'best s':>8}{'Mtok/s':>9}{'MB/s':>8}{'vs 1 worker':>13}"
        f"{'vs tokenizer':>14}",
        f"  {'tokenizer, 1 thread':<24}{t['seconds']:>8.2f}{t['tokens_per_s'] / 1e6:>9.3f}"
        f"{t['mb_per_s']:>8.2f}{'-':>13}{1.0:>13.2f}x",
    ]
    for b in report["builds"]:
        name = f"build, {b['workers']} worker{'s' * (b['workers'] > 1)}"
        lines.append(f"  {name:<24}{b['seconds']:>8.2f}{b['tokens_per_s'] / 1e6:>9.3f}"
                     f"{b['mb_per_s']:>8.2f}{b['vs_one_worker']:>12.2f}x"
                     f"{b['vs_tokenizer']:>13.2f}x")
    lines += ["", f"  identical: {'yes' if report['identical'] else 'no'} "
                  f"({report['distinct_caches']} distinct cache(s) from "
                  f"{report['repeat'] * len(report['builds'])} builds)"]
    if not report["tokens_match"]:
        lines.append("  note: the builds and the tokenizer counted different numbers of tokens")
    for tg in report["targets"]:
        lines.append(f"  target {tg['what']}: {tg['got']:.2f}x {'ok' if tg['ok'] else 'MISSED'}")
    return "\n".join(lines)


def run_build_bench(args: argparse.Namespace) -> int:
    """``shardwise bench build``: make the corpus, measure, print (``--json``: a dict)."""
    if not args.mb > 0:
        raise ConfigError(f"--mb must be positive, got {args.mb}")
    for name in ("workers", "repeat"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(args, name)}")
    source, tokenizer = resolve_inputs(args.corpus, args.tokenizer)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-", dir=args.tmp_dir) as tmp:
        work = Path(tmp)
        corpus = make_corpus(read_texts(source, int(args.mb * MB)), args.mb,
                             work / "corpus.jsonl")
        log(f"shardwise bench build: corpus of {corpus.text_bytes / MB:.1f} MB text, "
            f"{corpus.documents:,} documents in {work}")
        report: dict[str, Any] = {
            "corpus": {"source": str(source), "documents": corpus.documents,
                       "text_bytes": corpus.text_bytes, "file_bytes": corpus.file_bytes,
                       "copies": corpus.copies},
            "tokenizer_path": str(tokenizer),
            "machine": {"cpu_count": os.cpu_count(), "usable_cores": _usable_cores()},
            "repeat": args.repeat, "batch": BATCH,
        }
        report.update(run_rounds(corpus, tokenizer, args.workers, args.repeat, work, log))
    report["targets"] = targets(report)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["run_build_bench"]
