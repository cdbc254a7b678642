"""The package's shape: the public names, lint and types, import cost (the layering is
tests/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shardwise

SRC = Path(shardwise.__file__).resolve().parent
ROOT = SRC.parent.parent

def test_public_names_are_pinned() -> None:
    assert shardwise.__all__ == sorted(shardwise.__all__)
    assert shardwise.__all__ == [
        "Blend", "Cache", "CacheError", "CacheMismatchError", "ChatProcessor", "ConfigError",
        "ContiguousShards", "CorruptChunkError", "InputError", "Loader", "LoaderState", "Output",
        "PAD",
        "PackedSFT", "Placement", "ProducerDirDataset", "ProducerTimeoutError", "RecordStream",
        "RemoteError",
        "SequentialConsumer", "ShardwiseError", "Shuffle", "StateError", "StreamDataset",
        "TokenDataset", "World", "__version__", "build", "numpy_loader", "open_cache",
    ]
    for name in shardwise.__all__:
        assert hasattr(shardwise, name)


def test_import_without_torch_is_light() -> None:
    code = ("import sys, time; t = time.perf_counter(); import shardwise; "
            "print(time.perf_counter() - t); "
            "print(sorted(m for m in ('torch', 'ray', 'pyarrow', 'tokenizers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[1] == "[]", f"import shardwise pulled in {out[1]}"


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_lint_and_types(tool: str) -> None:
    cmd = ([sys.executable, "-m", "ruff", "check", "src", "tests"] if tool == "ruff"
           else [sys.executable, "-m", "mypy", "--no-error-summary"])
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
