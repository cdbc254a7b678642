"""Run one measurement in a fresh interpreter (nothing this process imported, mapped or
cached helps it) and read back the JSON line it prints last."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from shardwise.errors import ConfigError


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB: ``VmHWM`` of ``/proc/self/status``
    (not ``ru_maxrss``: on Linux a spawned child's starts at its parent's), else (not
    Linux) ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)


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


__all__ = ["peak_rss_mb", "run_child"]
