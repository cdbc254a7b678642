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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.errors import ConfigError, ShardwiseError

BATCH = 1024
MB = 1_000_000
TARGET_VS_TOKENIZER = 0.8   # one worker vs the tokenizer alone, one thread
TARGET_EFFICIENCY = 0.8     # N workers vs N × one worker
BUSY_LOAD = 1.25            # load average per core above which the figures are suspect
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


def _child_main(corpus: str, tokenizer: str, part: int, parts: int) -> None:
    """The tokenizer alone, in a fresh process with :data:`_SINGLE_THREAD_ENV`: load part
    ``part`` of ``parts`` of the texts, say ``ready``, wait for ``go`` on stdin, then time
    ``encode_batch_fast`` (or ``encode_batch``) in batches of :data:`BATCH`; print JSON."""
    import orjson
    from tokenizers import Tokenizer

    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    texts = texts[part * len(texts) // parts:(part + 1) * len(texts) // parts]
    tok = Tokenizer.from_file(tokenizer)
    fast = hasattr(tok, "encode_batch_fast")
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    print("ready", flush=True)
    sys.stdin.readline()
    tokens = 0
    started, cpu = time.time(), time.process_time()
    for i in range(0, len(texts), BATCH):
        tokens += sum(len(e.ids) for e in encode(texts[i:i + BATCH], add_special_tokens=False))
    print(json.dumps({"start": started, "end": time.time(),
                      "cpu_seconds": time.process_time() - cpu, "tokens": tokens,
                      "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                      "model": type(tok.model).__name__,
                      "method": "encode_batch_fast" if fast else "encode_batch",
                      "env": {k: os.environ.get(k) for k in _SINGLE_THREAD_ENV}}))


def _tokenizer_processes(corpus: Corpus, tokenizer: Path, parts: int) -> list[Any]:
    """Start ``parts`` baseline processes and wait until each has loaded its texts."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **_SINGLE_THREAD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    code = ("import sys; from shardwise.bench.build import _child_main; "
            "_child_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(corpus.path), str(tokenizer),
                               str(k), str(parts)], env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for k in range(parts)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            for q in procs:
                q.kill()
            _, err = p.communicate()
            raise ShardwiseError(f"the tokenizer baseline process failed (exit "
                                 f"{p.returncode}):\n{err.strip()}")
    return procs


def measure_tokenizer(corpus: Corpus, tokenizer: Path, parts: int = 1) -> dict[str, Any]:
    """One timed pass of the tokenizer alone over all texts, split over ``parts``
    single-threaded processes started together (``parts=1``: its own single-thread speed;
    more: what this machine allows in parallel). Fresh interpreters, so the environment is
    set before the Rust thread pool exists."""
    procs = _tokenizer_processes(corpus, tokenizer, parts)
    for p in procs:
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise ShardwiseError(f"the tokenizer baseline process failed (exit "
                                 f"{p.returncode}):\n{err.strip()}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    first: dict[str, Any] = results[0]
    return {**first, "seconds": max(r["end"] for r in results) - min(r["start"] for r in results),
            "cpu_seconds": sum(r["cpu_seconds"] for r in results),
            "tokens": sum(r["tokens"] for r in results)}


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
                  executor: Any = None) -> dict[str, Any]:
    """Wall and CPU seconds, tokens and the cache digest of one fresh build into ``out``
    (removed afterwards), on local processes or on ``executor`` (a fresh RayExecutor)."""
    from shardwise.writer.api import build

    cpu, started = _cpu_seconds(), time.perf_counter()
    summary = build([str(corpus.path)], out, tokenizer=tokenizer, workers=workers,
                    progress=False, executor=executor)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu + getattr(executor, "task_cpu_seconds", 0.0)
    digest = cache_digest(out)
    shutil.rmtree(out)
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": summary.tokens, "digest": digest}


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
            "runs": [r["seconds"] for r in runs], "tokens": runs[0]["tokens"],
            "tokens_per_s": runs[0]["tokens"] / best, "mb_per_s": text_bytes / MB / best}


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}{'es' if what.endswith('s') else 's'}"


def run_rounds(corpus: Corpus, tokenizer: Path, max_workers: int, repeat: int, work: Path,
               log: Any, ray: bool = False) -> dict[str, Any]:
    """``repeat`` rounds of every measurement (tokenizer with n processes, then the build
    with n workers (then on Ray, if ``ray``), for n = 1..max_workers); the figures and the
    identity check."""
    counts = range(1, max_workers + 1)
    tok_runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    build_runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    ray_runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts} if ray else {}
    for r in range(repeat):
        for n in counts:
            tok_runs[n].append(measure_tokenizer(corpus, tokenizer, n))
            build_runs[n].append(measure_build(corpus, tokenizer, n, work / f"cache-{r}-{n}"))
            on_ray = ""
            if ray:
                from shardwise.writer.ray_executor import RayExecutor

                ray_runs[n].append(measure_build(corpus, tokenizer, n, work / f"ray-{r}-{n}",
                                                 RayExecutor(n)))
                on_ray = f"; on Ray {ray_runs[n][-1]['seconds']:.2f} s"
            log(f"  round {r + 1}/{repeat}: tokenizer, {_plural(n, 'process')} "
                f"{tok_runs[n][-1]['seconds']:.2f} s; build, {_plural(n, 'worker')} "
                f"{build_runs[n][-1]['seconds']:.2f} s{on_ray}")
    first = tok_runs[1][0]
    tok = {**_figures(tok_runs[1], corpus.text_bytes),
           **{k: first[k] for k in ("vocab_size", "model", "method", "env")}}
    parallel = [{"processes": n, **_figures(tok_runs[n], corpus.text_bytes)} for n in counts]
    builds = [{"workers": n, **_figures(build_runs[n], corpus.text_bytes)} for n in counts]
    for t in parallel:
        t["vs_one_thread"] = t["mb_per_s"] / tok["mb_per_s"]
    for b, t in zip(builds, parallel, strict=True):
        b["vs_one_worker"] = b["mb_per_s"] / builds[0]["mb_per_s"]
        b["efficiency"] = b["vs_one_worker"] / b["workers"]
        b["vs_tokenizer"] = b["mb_per_s"] / tok["mb_per_s"]
        b["vs_tokenizer_same_count"] = b["mb_per_s"] / t["mb_per_s"]
    rays = [{"workers": n, **_figures(ray_runs[n], corpus.text_bytes)} for n in ray_runs]
    for rb, b, t in zip(rays, builds, parallel, strict=False):
        rb.update(vs_local=rb["mb_per_s"] / b["mb_per_s"],
                  vs_one_worker=rb["mb_per_s"] / rays[0]["mb_per_s"],
                  vs_tokenizer=rb["mb_per_s"] / tok["mb_per_s"],
                  vs_tokenizer_same_count=rb["mb_per_s"] / t["mb_per_s"])
    all_builds = (*build_runs.values(), *ray_runs.values())
    digests = {r["digest"] for runs in all_builds for r in runs}
    return {"tokenizer": tok, "tokenizer_parallel": parallel[1:], "builds": builds,
            **({"ray_builds": rays} if ray else {}),
            "identical": len(digests) == 1, "distinct_caches": len(digests),
            "tokens_match": all(r["tokens"] == first["tokens"]
                                for runs in (*tok_runs.values(), *all_builds) for r in runs)}


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


def _row(name: str, f: dict[str, Any], vs_one: float | None, vs_tok: float,
         vs_same: float | None) -> str:
    cells = [f"{x:.2f}x" if x is not None else "-" for x in (vs_one, vs_tok, vs_same)]
    return (f"  {name:<24}{f['seconds']:>8.2f}{f['cpu_seconds']:>8.2f}"
            f"{f['tokens_per_s'] / 1e6:>8.3f}{f['mb_per_s']:>7.2f}"
            f"{cells[0]:>13}{cells[1]:>14}{cells[2]:>12}")


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def format_report(report: dict[str, Any]) -> str:
    c, t, m = report["corpus"], report["tokenizer"], report["machine"]
    rays = report.get("ray_builds", [])
    lines = [
        f"shardwise bench build: {c['text_bytes'] / MB:.1f} MB of text in {c['documents']:,} "
        f"documents ({c['file_bytes'] / MB:.1f} MB of JSONL, {c['copies']} copies of "
        f"{c['source']}), {t['tokens']:,} tokens",
        f"  tokenizer {report['tokenizer_path']} ({t['model']}, vocab {t['vocab_size']:,}), "
        f"{t['method']} in batches of {BATCH}, 1 thread per process",
        f"  cores: {m['usable_cores']} usable of {m['cpu_count']} (load average "
        f"{_fmt(m['load_before'])} before, {_fmt(m['load_after'])} after); best of "
        f"{report['repeat']} interleaved runs each; MB = 10^6 bytes of text",
        "",
        f"  {'':<24}{'best s':>8}{'cpu s':>8}{'Mtok/s':>8}{'MB/s':>7}{'vs 1 worker':>13}"
        f"{'vs tokenizer':>14}{'vs tok x N':>12}" + (f"{'vs local':>10}" if rays else ""),
        _row("tokenizer, 1 thread", t, None, 1.0, None),
    ]
    for p in report["tokenizer_parallel"]:
        lines.append(_row(f"tokenizer, {p['processes']} processes", p, None,
                          p["vs_one_thread"], None))
    for b in report["builds"]:
        lines.append(_row(f"build, {_plural(b['workers'], 'worker')}", b, b["vs_one_worker"],
                          b["vs_tokenizer"], b["vs_tokenizer_same_count"]))
    for b in rays:
        lines.append(_row(f"ray, {_plural(b['workers'], 'worker')}", b, b["vs_one_worker"],
                          b["vs_tokenizer"], b["vs_tokenizer_same_count"])
                     + f"{b['vs_local']:>9.2f}x")
    if rays:
        r = report["ray"]
        lines.append(f"  ray {r['version']}: a local cluster of {r['cpus']} CPUs, started in "
                     f"{r['start_seconds']:.1f} s and warmed up before timing (not counted); "
                     "vs local: Ray's MB/s / the local build's with as many workers")
    n_builds = report["repeat"] * (len(report["builds"]) + len(rays))
    lines += ["", f"  identical: {'yes' if report['identical'] else 'no'} "
                  f"({report['distinct_caches']} distinct cache(s) from {n_builds} builds)"]
    if not report["tokens_match"]:
        lines.append("  note: the builds and the tokenizer counted different numbers of tokens")
    for tg in report["targets"]:
        lines.append(f"  target {tg['what']}: {tg['got']:.2f}x {'ok' if tg['ok'] else 'MISSED'}")
    if report["machine"]["busy"]:
        lines.append(f"  warning: other work kept this machine busy (load average above "
                     f"{BUSY_LOAD:.1f} per core): wall-time figures are unreliable; compare "
                     "'cpu s', or run again when it is idle")
    return "\n".join(lines)


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


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """``build`` under ``shardwise bench``'s subcommands."""
    from shardwise.bench import add_common, add_inputs

    b = which.add_parser("build", help="tokens/s of the build for 1..N workers vs the "
                                        "tokenizer's own single-thread speed")
    add_inputs(b, corpus="JSONL with a 'text' field, repeated to --mb")
    b.add_argument("--mb", type=float, default=64.0,
                   help="MB (10^6 bytes) of text to build (default 64)")
    b.add_argument("--workers", type=int, default=2,
                   help="measure 1, 2, ... up to this many workers (default 2)")
    add_common(b, repeat=3, repeat_help="runs of each measurement; the best is reported")
    add_executor_argument(b)
    return b


def run(args: argparse.Namespace) -> int:
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
            "machine": {"cpu_count": os.cpu_count(), "usable_cores": _usable_cores(),
                        "load_before": _load()},
            "repeat": args.repeat, "batch": BATCH,
        }
        on_ray = getattr(args, "executor", "local") == "ray"
        session: AbstractContextManager[dict[str, Any]] = (
            _ray_session(args.workers, corpus, tokenizer, work) if on_ray else nullcontext({}))
        with session as ray_info:
            report.update(run_rounds(corpus, tokenizer, args.workers, args.repeat, work, log,
                                     ray=on_ray))
        if on_ray:
            report["ray"] = ray_info
        report["machine"]["load_after"] = _load()
    loads = [x for x in (report["machine"]["load_before"], report["machine"]["load_after"])
             if x is not None]
    report["machine"]["busy"] = max(loads, default=0.0) > BUSY_LOAD * _usable_cores()
    report["targets"] = targets(report)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["add_subparser", "run"]
