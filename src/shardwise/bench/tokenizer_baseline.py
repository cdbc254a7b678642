"""The baseline of ``shardwise bench build``: the tokenizer alone, single-threaded, in fresh
processes started together.

Why its own module: the baseline must not share anything with what it is compared to (no
imported shardwise state, no Rust thread pool created before the environment is set), so
it runs as separate interpreters with :data:`_SINGLE_THREAD_ENV`; this module is both the
parent's launcher and the child's entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shardwise.bench.child import child_env
from shardwise.bench.text_corpus import Corpus
from shardwise.errors import ShardwiseError

BATCH = 1024
_SINGLE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


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
    env = child_env(**_SINGLE_THREAD_ENV)
    code = ("import sys; from shardwise.bench.tokenizer_baseline import _child_main; "
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


__all__ = ["BATCH", "measure_tokenizer"]
