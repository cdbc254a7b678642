"""``shardwise bench remote-open``: what opening a cache on an object store costs the store,
per node, when every rank of a job opens it at once.

1. A token corpus (:mod:`shardwise.bench.read_data`) imported as a cache of ``--chunks``
   chunks, copied to a local S3 server (moto, in its own process, its request log kept)
   behind a proxy that adds ``--latency`` to every answer.
2. Rounds, each from empty node-local directories: ``1`` process alone, then
   ``--processes`` processes spread over ``--nodes`` simulated nodes (one ``local_dir``
   per node), all released at the same moment. Each process opens the cache and reads
   one example (its first batch).
3. Figures: the requests the server answered for the cache's head files (manifest,
   ledger, index: what opening asks for), counted in the server's own log, per round and
   per node; time to the first batch, median and slowest process.

Target (issue 21 item 3): the ``--processes`` round makes at most ``--nodes`` × the
requests of one process (one fetch per node, :mod:`shardwise.storage.heads`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shardwise.bench import add_common, check_counts
from shardwise.bench.moto import BUCKET, moto_server, store_options, upload
from shardwise.bench.proxy import start_proxy
from shardwise.bench.read_data import chunked_copy, make_corpus
from shardwise.errors import ConfigError
from shardwise.storage.heads import HEAD_NAMES

# a request line in the server's log (werkzeug may colour it)
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP')

OPEN_CODE = """
import json, os, sys, time
url, local_dir, go, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
seq_len = int(sys.argv[5])
import shardwise as sw
while not os.path.exists(go):
    time.sleep(0.002)
started = time.perf_counter()
cache = sw.open_cache(url, local_dir=local_dir, storage_options=options or None)
opened = time.perf_counter() - started
if seq_len:  # 0: open only
    ds = sw.TokenDataset(cache, seq_len=seq_len, seed=0,
                         plan_dir=os.path.join(local_dir, "plans"))
    ds.get_batch([0])
print(json.dumps({"open_s": opened, "first_batch_s": time.perf_counter() - started,
                  "chunks": len(cache.chunks), "fetched": cache.store.heads.fetched}))
"""


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """Register ``remote-open`` on ``shardwise bench``'s subcommands."""
    p = which.add_parser("remote-open", help="requests per node when every rank opens a "
                                             "cache on an S3 server at once")
    p.add_argument("--processes", type=int, default=16, help="processes opening (16)")
    p.add_argument("--nodes", type=int, default=4,
                   help="simulated nodes: one local_dir each (4)")
    p.add_argument("--tokens", type=int, default=4_000_000, help="tokens of the cache (4M)")
    p.add_argument("--chunks", type=int, default=8, help="chunks of the cache (8)")
    p.add_argument("--latency", type=float, default=0.05,
                   help="seconds added to every answer of the server (0.05)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per example (2048)")
    add_common(p, repeat=1, repeat_help="rounds of each size")
    return p


def open_at_once(url: str, local_dirs: list[Path], options: dict[str, Any],
                 seq_len: int, go: Path) -> list[dict[str, Any]]:
    """One process per entry of ``local_dirs`` (its node's directory), all released at
    once by creating ``go``, each opening the cache and reading its first example of
    ``seq_len`` tokens (0: opening only); what each printed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_CODE, url, str(d), str(go),
                               json.dumps(options), str(seq_len)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for d in local_dirs]
    try:
        time.sleep(0.5)  # let them start their interpreters before the go
        go.touch()
        done = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.communicate()
        go.unlink(missing_ok=True)
    for p, (_, stderr) in zip(procs, done, strict=True):
        if p.returncode != 0:
            raise ConfigError(f"an opening process failed (exit {p.returncode}):\n"
                              f"{stderr.strip()[-2000:]}")
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in done]


def head_requests(log: Path, since: int, prefix: str) -> tuple[int, int]:
    """Requests for the head files of the cache under ``/prefix`` in the server's log
    after byte ``since``; and the log's length now."""
    data = log.read_bytes()
    names = {f"/{prefix}/{n}" for n in HEAD_NAMES}
    n = sum(m.group(2).split("?")[0] in names
            for m in _REQUEST.finditer(data[since:].decode(errors="replace")))
    return n, len(data)


def _round(url: str, work: Path, processes: int, nodes: int, args: argparse.Namespace,
           options: dict[str, Any], log: Path) -> dict[str, Any]:
    base = work / f"nodes-{processes}"
    shutil.rmtree(base, ignore_errors=True)
    dirs = [base / f"node{k % nodes}" for k in range(processes)]
    _, since = head_requests(log, 0, "")
    got = open_at_once(url, dirs, options, args.seq_len, work / "go")
    time.sleep(0.5)  # the server's log written through
    requests, _ = head_requests(log, since, url.removeprefix("s3://"))
    firsts = [g["first_batch_s"] for g in got]
    return {"processes": processes, "nodes": nodes, "requests": requests,
            "fetchers": sum(g["fetched"] for g in got),
            "first_batch_median_s": statistics.median(firsts),
            "first_batch_max_s": max(firsts),
            "open_median_s": statistics.median(g["open_s"] for g in got)}


def run(args: argparse.Namespace) -> int:
    check_counts(args, processes=1, nodes=1, tokens=1, chunks=1, repeat=1)
    if args.nodes > args.processes:
        raise ConfigError(f"--nodes {args.nodes} exceeds --processes {args.processes}")
    work = Path(args.tmp_dir or tempfile.gettempdir()) / "shardwise-bench-remote-open"
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / f"corpus-{args.tokens}"
    make_corpus(prefix, args.tokens, seed=0)
    local, _ = chunked_copy(prefix, args.chunks)
    url, log = f"s3://{BUCKET}/cache", work / "moto.log"
    rounds: list[dict[str, Any]] = []
    with moto_server(log) as port, \
            start_proxy(("127.0.0.1", port), latency=args.latency) as slow:
        upload(local, url, store_options(port))
        for _ in range(args.repeat):
            for n, k in ((1, 1), (args.processes, args.nodes)):
                rounds.append(_round(url, work, n, k, args, store_options(slow), log))
    summary = _summary(rounds, args)
    print(json.dumps(summary, indent=1) if args.json else _report(summary))
    return 0


def _summary(rounds: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    one = [r for r in rounds if r["processes"] == 1]
    many = [r for r in rounds if r["processes"] == args.processes]
    worst_one = max(r["requests"] for r in one)
    worst_many = max(r["requests"] for r in many)
    return {"rounds": rounds, "one_process_requests": worst_one,
            "many_requests": worst_many, "limit": args.nodes * worst_one,
            "ok": worst_many <= args.nodes * worst_one,
            "first_batch_ratio": (statistics.median(r["first_batch_median_s"] for r in many)
                                  / statistics.median(r["first_batch_median_s"]
                                                      for r in one)),
            "latency_s": args.latency}


def _report(s: dict[str, Any]) -> str:
    lines = [f"opening a cache on S3 (moto + {s['latency_s'] * 1000:.0f} ms per answer); "
             "head-file requests counted in the server's log"]
    for r in s["rounds"]:
        lines.append(f"  {r['processes']:3d} processes on {r['nodes']} node(s): "
                     f"{r['requests']:3d} requests ({r['requests'] / r['nodes']:.1f} per "
                     f"node; {r['fetchers']} fetcher(s)), first batch median "
                     f"{r['first_batch_median_s']:.2f} s, slowest "
                     f"{r['first_batch_max_s']:.2f} s")
    verdict = "OK" if s["ok"] else "OVER"
    lines.append(f"  requests: {s['many_requests']} vs limit {s['limit']} (nodes x "
                 f"{s['one_process_requests']} of one process): {verdict}; first batch "
                 f"{s['first_batch_ratio']:.2f}x one process's")
    return "\n".join(lines)


__all__ = ["OPEN_CODE", "head_requests", "open_at_once"]
