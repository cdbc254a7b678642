"""Run one measurement in a fresh interpreter (nothing this process imported, mapped or
cached helps it) and read back the JSON line it prints last."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from shardwise.errors import ConfigError


def child_env(**extra: str) -> dict[str, str]:
    """This environment plus ``extra``, with the directory this ``shardwise`` package was
    imported from first on ``PYTHONPATH``: a child measures the same code as its parent
    (a checkout's ``src/``, a worktree's, or an installed wheel's site-packages)."""
    here = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def run_child(code: str, *argv: object, env: dict[str, str] | None = None,
              what: str = "a bench process") -> dict[str, Any]:
    """``python -c code argv…``; its last line of output, parsed as JSON. A failed run
    raises with the end of its stderr."""
    proc = subprocess.run([sys.executable, "-c", code, *map(str, argv)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"{what} failed (exit {proc.returncode}):\n"
                          f"{proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def memory_mb() -> dict[str, float]:
    """This process's peak RSS (``peak_mb``), RSS now (``rss_mb``), heap (``anon_mb``) and
    mapped file pages (``file_mb``), from /proc/self/status.

    Not ``ru_maxrss``: Linux starts a child's ``ru_maxrss`` at its parent's RSS across
    fork and exec, so a small child of a big parent reports the parent's peak. Self-contained
    (imports inside) so :data:`MEMORY_CODE` can paste it into a child's code."""
    import resource
    import sys

    try:
        with open("/proc/self/status") as f:
            kb = {k: int(v.split()[0]) for k, v in (x.split(":", 1) for x in f)
                  if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
        return {"peak_mb": kb["VmHWM"] / 1024, "rss_mb": kb["VmRSS"] / 1024,
                "anon_mb": kb["RssAnon"] / 1024, "file_mb": kb["RssFile"] / 1024}
    except (OSError, KeyError):  # not Linux: the best there is
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_mb": peak / 1024 / (1024 if sys.platform == "darwin" else 1)}


MEMORY_CODE = inspect.getsource(memory_mb).replace(" -> dict[str, float]", "")
""":func:`memory_mb` as source, for the code of a child that must not import shardwise."""

__all__ = ["MEMORY_CODE", "child_env", "memory_mb", "run_child"]
