"""The package's shape: the public names, the layering, lint and types, import cost."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import shardwise

SRC = Path(shardwise.__file__).resolve().parent
ROOT = SRC.parent.parent

# layer -> layers it may import (besides itself, errors and the top-level package)
ALLOWED = {
    "format": set(),
    "plan": {"format"},
    "build": {"format"},
    "read": {"format", "plan", "build", "state"},
    "state": set(),
    "testing": {"read"},
    "integrations": {"format", "plan", "build", "read", "state"},
    "torch": {"integrations"},
    "cli": {"format", "plan", "build", "read", "state", "integrations", "torch"},
}
CORE = ("format", "plan", "build", "read", "state")


def test_public_names_are_pinned() -> None:
    assert shardwise.__all__ == sorted(shardwise.__all__)
    assert shardwise.__all__ == [
        "Blend", "Cache", "CacheError", "CacheMismatchError", "ChatProcessor", "ConfigError",
        "ContiguousShards", "CorruptChunkError", "InputError", "LoaderState", "PAD",
        "PackedSFT", "ProducerDirDataset", "ProducerTimeoutError", "RecordStream",
        "SequentialConsumer", "ShardwiseError", "Shuffle", "StateError", "StreamDataset",
        "TokenDataset", "World", "__version__", "build", "open_cache",
    ]
    for name in shardwise.__all__:
        assert hasattr(shardwise, name)


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path, *, module_level: bool = False) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    nodes = tree.body if module_level else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_each_layer_imports_only_the_layers_below_it() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        layer = _layer(path)
        if layer not in ALLOWED:
            continue
        if layer in CORE:  # a lazy import inside a function is allowed; at import, never
            for name in _imports(path, module_level=True):
                if name.split(".")[0] in ("torch", "ray"):
                    bad.append(f"{path.relative_to(SRC)} imports {name} (core must not)")
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "shardwise" or len(parts) < 2:
                continue
            target = parts[1]
            if target in ("errors", layer) or target not in ALLOWED:
                continue
            if target not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(SRC)} ({layer}) imports {name}")
    assert not bad, "\n".join(bad)


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
