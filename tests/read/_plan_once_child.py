"""One process asking for a document-shuffle plan (tests/read/test_plan_once.py).

``python _plan_once_child.py PLAN_DIR MARKS NAME MODE``. Markers in MARKS show the test
what happened, without timing: ``entering.NAME`` (whether a plan was published when this
process asked), ``built.NAME`` (this process's builder read the document lengths: it
built), ``building.NAME`` (its builder wrote a first block). MODE ``hold``: the builder
then waits for MARKS/go, holding the lock mid-build (the test's hook to race or kill it);
``free``: it builds straight through. Prints the sha256 of the arrays it mapped.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from shardwise.concurrency.poll import wait_until
from shardwise.read.tokens.plans import load_or_build

LENGTHS = np.arange(5000) % 53
PARAMS = {"seed": 7, "epoch": 0, "seq_len": 32, "drop_last": True}
KEY = {"cache": "race"}
BLOCK = 500


def main() -> None:
    plan_dir, marks, name, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]

    def lengths() -> np.ndarray:
        (marks / f"built.{name}").write_text(str(os.getpid()))
        return LENGTHS

    def progress(done: int) -> None:
        (marks / f"building.{name}").touch()
        if mode == "hold":
            wait_until(lambda: (marks / "go").exists(), timeout=math.inf, poll_interval=0.02,
                       what="the test's go")

    published = any(plan_dir.glob("*.json"))
    (marks / f"entering.{name}").write_text(json.dumps(published))
    index = load_or_build(plan_dir, KEY, lengths, block=BLOCK, progress=progress, **PARAMS)
    print(sha(index.doc_order, index.cum_tokens))


def sha(*arrays: np.ndarray) -> str:
    return hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in arrays)).hexdigest()


if __name__ == "__main__":
    main()
