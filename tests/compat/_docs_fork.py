"""Runs doc blocks for test_docs_run.py, each in a process of its own forked from this one
after the modules every block imports (torch, shardwise, transformers…) are imported
once: a block still starts from no state of another block (its own process, its own
``__main__`` namespace), but not from a bare interpreter's import time.

Protocol: one JSON request a line on stdin, ``{"code", "where", "out"}``; the block runs in
a forked child, as ``python -c code`` would (in a ``__main__`` module of its own,
``sys.argv == ["-c"]``, ending as the interpreter ends), its stdout and stderr written to
``out``; one JSON line answers, ``{"returncode"}`` (a signal: minus its number).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import types

PREIMPORTED = ("numpy", "torch", "torch.utils.data", "shardwise", "shardwise.torch",
               "transformers", "torchdata.stateful_dataloader")


def run(code: str, where: str, out: str) -> int:
    pid = os.fork()
    if pid == 0:
        # The block's process. It never returns to the loop below: it ends as ``python -c``
        # ends (an exception out of the block: status 1 and its traceback; then threads
        # joined, atexit run, the interpreter finalized).
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = ["-c"]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(code, where, "exec"), main.__dict__)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    import importlib

    for name in PREIMPORTED:
        importlib.import_module(name)
    gc.freeze()  # the imports' objects stay shared with every block (no collector pass copies them)
    for line in sys.stdin:
        request = json.loads(line)
        code = run(request["code"], request["where"], request["out"])
        print(json.dumps({"returncode": code}), flush=True)
