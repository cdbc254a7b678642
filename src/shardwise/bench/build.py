"""``shardwise bench build``: build throughput for 1..N workers, beside the tokenizer's own
single-thread speed, measured in the same run on the same text.

The corpus is the bundled sample (or ``--corpus``) repeated until it holds ``--mb`` MB
(10^6 bytes) of UTF-8 text, each copy's documents prefixed ``[copy k]`` so no two
documents are equal. Then, ``--repeat`` rounds, interleaved so that a burst of load on a
shared machine hits every figure alike (the best, i.e. shortest, run of each is kept)::

    round r:  tokenizer, 1 process │ build, 1 worker │ … │ tokenizer, N procs │ build, N workers

"tokenizer, n processes" splits the texts over n fresh single-threaded processes started
together: n = 1 is the tokenizer's own single-thread speed, larger n what this machine
allows in parallel right now (the ceiling for n workers; "vs tok x N" compares to it).

MB/s counts the text bytes (not the JSON around them), so the build and the tokenizer
are compared on the same work; "cpu s" is the CPU time the measured work took (for a
build: the coordinator and its workers), which noise from other tenants inflates less than
wall time. Every build's cache bytes are hashed: they must all be identical (the cache
does not depend on the worker count).

``--executor ray`` also times each build on Ray, right after the local one of the same
worker count, and prints it beside it ("vs local"). Ray runs as a local cluster of
``--workers`` CPUs, started once and warmed up (its workers import shardwise) before any
timing; neither is counted. A Ray build's "cpu s" is the driver's plus its tasks'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from shardwise.bench import add_common, add_inputs, check_counts
from shardwise.bench.build_bucket import add_bucket_argument, token_digest, upload_corpus
from shardwise.bench.build_report import BUSY_LOAD, format_report, plural, targets
from shardwise.bench.text_corpus import MB, Corpus, make_corpus, read_texts, resolve_inputs
from shardwise.bench.tokenizer_baseline import BATCH, measure_tokenizer
from shardwise.errors import ConfigError


def cache_digest(root: Path) -> str:
    """A hash of every file of a cache: relative paths and bytes."""
    import xxhash

    h = xxhash.xxh3_128()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the build's workers)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure_build(corpus: Corpus, tokenizer: Path, workers: int, out: Path,
                  executor: Any = None, chunk_mb: float | None = None) -> dict[str, Any]:
    """Wall and CPU seconds, tokens and the cache digest of one fresh build into ``out``
    (removed afterwards), on local processes or on ``executor`` (a fresh RayExecutor), with
    chunks of ``chunk_mb`` (None: the default)."""
    from shardwise.writer.api import build

    cpu, started = _cpu_seconds(), time.perf_counter()
    summary = build([str(corpus.path)], out, tokenizer=tokenizer, workers=workers,
                    progress=False, executor=executor, chunk_mb=chunk_mb)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu + getattr(executor, "task_cpu_seconds", 0.0)
    digest = cache_digest(out)
    token_files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*")
                   if p.suffix in (".bin", ".idx")}
    shutil.rmtree(out)
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": summary.tokens, "digest": digest,
            "token_digest": token_digest(token_files)}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _load() -> float | None:
    """The 1-minute load average: other tenants' work shows here."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _figures(runs: list[dict[str, Any]], text_bytes: int) -> dict[str, Any]:
    """The best (shortest) of ``runs``, as rates; every run is kept for the record."""
    best = min(r["seconds"] for r in runs)
    return {"seconds": best, "cpu_seconds": min(r["cpu_seconds"] for r in runs),
            "runs": [r["seconds"] for r in runs],
            "cpu_runs": [r["cpu_seconds"] for r in runs], "tokens": runs[0]["tokens"],
            "tokens_per_s": runs[0]["tokens"] / best, "mb_per_s": text_bytes / MB / best}


def run_rounds(corpus: Corpus, tokenizer: Path, max_workers: int, repeat: int, work: Path,
               log: Any, ray: bool = False, bucket: tuple[str, str] | None = None,
               chunk_mb: float | None = None) -> dict[str, Any]:
    """``repeat`` rounds of every measurement (tokenizer with n processes, then the build
    with n workers (then on Ray, if ``ray``; then from and to ``bucket`` = (corpus URL,
    prefix), on the same executor), for n = 1..max_workers); the figures and the identity
    check."""
    counts = range(1, max_workers + 1)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        k: {n: [] for n in counts} for k in ("tok", "build", "ray", "bucket")}
    for r in range(repeat):
        for n in counts:
            runs["tok"][n].append(measure_tokenizer(corpus, tokenizer, n))
            runs["build"][n].append(measure_build(corpus, tokenizer, n, work / f"cache-{r}-{n}",
                                                  chunk_mb=chunk_mb))
            line = (f"  round {r + 1}/{repeat}: tokenizer, {plural(n, 'process')} "
                    f"{runs['tok'][n][-1]['seconds']:.2f} s; build, {plural(n, 'worker')} "
                    f"{runs['build'][n][-1]['seconds']:.2f} s")
            log(line + _more_builds(corpus, tokenizer, n, work, r, ray, bucket, runs,
                                    chunk_mb))
    return _report(corpus, runs, ray, bucket is not None)


def _more_builds(corpus: Corpus, tokenizer: Path, n: int, work: Path, r: int, ray: bool,
                 bucket: tuple[str, str] | None, runs: dict[str, Any],
                 chunk_mb: float | None) -> str:
    """The Ray build and the bucket build of round ``r`` with ``n`` workers, if asked
    for; what to add to the round's log line."""
    from shardwise.bench.build_bucket import measure_bucket_build

    def executor() -> Any:
        from shardwise.writer.ray_executor import RayExecutor

        return RayExecutor(n) if ray else None

    said = {}
    # the bucket build and the disk build it is compared with take turns going first
    # (rounds 2, 4…: the bucket's first), so a trend in the machine's load hits both alike
    for kind in (("ray", "bucket") if r % 2 == 0 or bucket is None else ("bucket", "ray")):
        if kind == "ray" and ray:
            runs["ray"][n].append(measure_build(corpus, tokenizer, n, work / f"ray-{r}-{n}",
                                                executor(), chunk_mb))
            said["ray"] = f"; on Ray {runs['ray'][n][-1]['seconds']:.2f} s"
        if kind == "bucket" and bucket is not None:
            runs["bucket"][n].append(measure_bucket_build(
                bucket[0], tokenizer, n, f"{bucket[1]}/cache-{r}-{n}", executor(), chunk_mb))
            said["bucket"] = f"; bucket to bucket {runs['bucket'][n][-1]['seconds']:.2f} s"
    return "".join(said.get(k, "") for k in ("ray", "bucket"))


def _report(corpus: Corpus, runs: dict[str, Any], ray: bool, bucket: bool
            ) -> dict[str, Any]:
    first = runs["tok"][1][0]
    counts = sorted(runs["tok"])
    tok = {**_figures(runs["tok"][1], corpus.text_bytes),
           **{k: first[k] for k in ("vocab_size", "model", "method", "env")}}
    parallel = [{"processes": n, **_figures(runs["tok"][n], corpus.text_bytes)}
                for n in counts]
    builds = [{"workers": n, **_figures(runs["build"][n], corpus.text_bytes)} for n in counts]
    for t in parallel:
        t["vs_one_thread"] = t["mb_per_s"] / tok["mb_per_s"]
    for b, t in zip(builds, parallel, strict=True):
        b["vs_one_worker"] = b["mb_per_s"] / builds[0]["mb_per_s"]
        b["efficiency"] = b["vs_one_worker"] / b["workers"]
        b["vs_tokenizer"] = b["mb_per_s"] / tok["mb_per_s"]
        b["vs_tokenizer_same_count"] = b["mb_per_s"] / t["mb_per_s"]
    rays = _versus(runs["ray"], builds, parallel, tok, corpus) if ray else []
    buckets = (_versus(runs["bucket"], rays or builds, parallel, tok, corpus)
               if bucket else [])
    all_builds = [r for k in ("build", "ray") for rs in runs[k].values() for r in rs]
    digests = {r["digest"] for r in all_builds}
    token_digests = {r["token_digest"] for r in all_builds} | {
        r["digest"] for rs in runs["bucket"].values() for r in rs}
    return {"tokenizer": tok, "tokenizer_parallel": parallel[1:], "builds": builds,
            **({"ray_builds": rays} if ray else {}),
            **({"bucket_builds": buckets} if bucket else {}),
            "identical": len(digests) == 1 and len(token_digests) == 1,
            "distinct_caches": len(digests),
            "tokens_match": all(r["tokens"] == first["tokens"] for k in runs
                                for rs in runs[k].values() for r in rs)}


def _versus(runs: dict[int, list[dict[str, Any]]], base: list[dict[str, Any]],
            parallel: list[dict[str, Any]], tok: dict[str, Any], corpus: Corpus
            ) -> list[dict[str, Any]]:
    """Figures of more builds (Ray, bucket) with ``vs_local``: their MB/s over ``base``'s
    (the builds they are compared with, worker count by worker count)."""
    out = [{"workers": n, **_figures(runs[n], corpus.text_bytes)} for n in sorted(runs)]
    for x, b, t in zip(out, base, parallel, strict=False):
        x.update(vs_local=x["mb_per_s"] / b["mb_per_s"],
                 vs_local_cpu=b["cpu_seconds"] / x["cpu_seconds"],
                 **_paired(x, b),
                 vs_one_worker=x["mb_per_s"] / out[0]["mb_per_s"],
                 vs_tokenizer=x["mb_per_s"] / tok["mb_per_s"],
                 vs_tokenizer_same_count=x["mb_per_s"] / t["mb_per_s"])
    return out


def _paired(x: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The ratio round by round (each run over the ``base`` run of the same round): its
    median and its range, by wall and by CPU time; a round's burst of load on a shared
    machine moves one ratio, not the median."""
    import statistics

    wall = [b / s for s, b in zip(x["runs"], base["runs"], strict=False)]
    cpu = [b / s for s, b in zip(x["cpu_runs"], base["cpu_runs"], strict=False)]
    return {"vs_local_rounds": wall, "vs_local_median": statistics.median(wall),
            "vs_local_range": [min(wall), max(wall)],
            "vs_local_cpu_median": statistics.median(cpu)}


def add_executor_argument(parser: argparse.ArgumentParser) -> None:
    """``--executor`` of ``shardwise bench build``."""
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="ray: also time every build on a local Ray cluster of --workers "
                             "CPUs, beside the local executor's, with the ratio")


@contextmanager
def _ray_session(workers: int, corpus: Corpus, tokenizer: Path, work: Path
                 ) -> Iterator[dict[str, Any]]:
    """A local Ray of ``workers`` CPUs for the Ray builds, started and warmed up (a small
    build of ``workers`` tasks, so every worker has imported shardwise) before timing."""
    from shardwise.writer.api import build
    from shardwise.writer.ray_executor import RayExecutor, import_ray

    started = time.perf_counter()
    session = RayExecutor(workers).connect()
    try:
        info = {"version": import_ray().__version__, "cpus": workers,
                "start_seconds": time.perf_counter() - started}
        with open(corpus.path, "rb") as f:
            head = b"".join(f.readline() for _ in range(2000))
        (work / "warmup.jsonl").write_bytes(head)
        build([str(work / "warmup.jsonl")], work / "warmup", tokenizer=tokenizer,
              segment_bytes=len(head) // workers + 1, progress=False,
              executor=RayExecutor(workers))
        shutil.rmtree(work / "warmup")
        yield info
    finally:
        session.close()


@contextmanager
def _bucket(url: str | None, corpus: Corpus) -> Iterator[tuple[str, str] | None]:
    """The corpus uploaded to ``url`` (``--bucket``) for the rounds, removed after."""
    if url is None:
        yield None
        return
    from shardwise.bench.build_bucket import remove_prefix

    prefix = url.rstrip("/")
    try:
        yield upload_corpus(corpus.path, prefix), prefix
    finally:
        remove_prefix(prefix)


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """``build`` under ``shardwise bench``'s subcommands."""
    b = which.add_parser("build", help="tokens/s of the build for 1..N workers vs the "
                                        "tokenizer's own single-thread speed")
    add_inputs(b, corpus="JSONL with a 'text' field, repeated to --mb")
    b.add_argument("--mb", type=float, default=64.0,
                   help="MB (10^6 bytes) of text to build (default 64)")
    b.add_argument("--workers", type=int, default=2,
                   help="measure 1, 2, ... up to this many workers (default 2)")
    b.add_argument("--chunk-mb", type=float, default=None, metavar="MB",
                   help="every build's chunk size (default: the build's, 64 MiB of tokens); "
                        "smaller makes several chunks per task, so a bucket build's uploads "
                        "overlap its tokenizing")
    add_common(b, repeat=3, repeat_help="runs of each measurement; the best is reported")
    add_executor_argument(b)
    add_bucket_argument(b)
    return b


def run(args: argparse.Namespace) -> int:
    """``shardwise bench build``: make the corpus, measure, print (``--json``: a dict)."""
    if not args.mb > 0:
        raise ConfigError(f"--mb must be positive, got {args.mb}")
    check_counts(args, workers=1, repeat=1)
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
            "machine": {"cpu_count": os.cpu_count(), "usable_cores": _usable_cores(),
                        "load_before": _load()},
            "repeat": args.repeat, "batch": BATCH, "chunk_mb": getattr(args, "chunk_mb", None),
        }
        on_ray = getattr(args, "executor", "local") == "ray"
        session: AbstractContextManager[dict[str, Any]] = (
            _ray_session(args.workers, corpus, tokenizer, work) if on_ray else nullcontext({}))
        with session as ray_info, _bucket(getattr(args, "bucket", None), corpus) as bucket:
            report.update(run_rounds(corpus, tokenizer, args.workers, args.repeat, work, log,
                                     ray=on_ray, bucket=bucket,
                                     chunk_mb=getattr(args, "chunk_mb", None)))
        report.update({"ray": ray_info} if on_ray else {},
                      **({"bucket": bucket[1]} if bucket else {}))
        report["machine"]["load_after"] = _load()
    loads = [x for x in (report["machine"]["load_before"], report["machine"]["load_after"])
             if x is not None]
    report["machine"]["busy"] = max(loads, default=0.0) > BUSY_LOAD * _usable_cores()
    report["targets"] = targets(report)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["add_subparser", "run"]
