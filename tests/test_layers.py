"""The tree is the architecture: each layer imports only the layers below it.

::

    errors  _version
    format  checkpoint  choice  concurrency  chart   (bytes; the protocol; option enums;
                                                      background threads, processes, polling;
                                                      text and SVG charts)
    remote  world                                    (the object-store client, its fault policy;
                                                      the world, which keeps torch's groups
                                                      until the exit hook)
    storage  sources  plan                           (where caches live; source files; pure plans)
    writer   read                                    (sources -> cache; cache -> examples)
    integrations  compat  testing                    (frameworks; seed systems' names; contracts)
    bench                                            (the harness behind `shardwise bench`)
    cli                                              (thin shells over library calls)

``import shardwise`` (the front door, ``sw.TokenDataset``) and ``shardwise.torch`` /
``shardwise.hf`` / ``shardwise.torchdata`` (shortcuts to ``integrations.*``) are for code
above the library: bench and cli.

A package may import itself and any package of a lower layer, never a sibling of its own
layer (read never imports writer) nor anything above it. Imports inside functions count too:
a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardwise

LAYERS = [
    {"errors", "_version"},
    {"format", "checkpoint", "choice", "concurrency", "chart"},
    {"remote", "world"},
    {"storage", "sources", "plan"},
    {"writer", "read"},
    {"integrations", "compat", "testing"},
    {"bench"},
    {"cli"},
]
RANK: dict[str, float] = {name: i for i, layer in enumerate(LAYERS) for name in layer}
RANK["torch"] = RANK["hf"] = RANK["torchdata"] = RANK["integrations"]
RANK["megatron"] = RANK["lightning"] = RANK["olmo"] = RANK["grain"] = RANK["integrations"]
RANK["torchtitan"] = RANK["litgpt"] = RANK["integrations"]
FRONT_DOOR = RANK["testing"] + 0.5  # `from shardwise import TokenDataset`
PACKAGE = Path(shardwise.__file__).parent
# the package's front door and the `shardwise.torch` shortcut sit above every layer
EXEMPT = {"__init__", "torch", "hf", "torchdata", "megatron", "lightning", "olmo", "grain",
          "torchtitan", "litgpt",
          "__main__"}


def _top(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "shardwise":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "shardwise":  # from shardwise import x: a submodule or a name
                found += [(node.lineno, f"shardwise.{a.name}"
                           if (PACKAGE / a.name).is_dir() or (PACKAGE / f"{a.name}.py").is_file()
                           else "shardwise.__init__") for a in node.names]
    return found


def _module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0].removesuffix(".py") not in EXEMPT)


def test_every_package_has_a_layer() -> None:
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _modules()}
    assert tops - set(RANK) == set(), "add the new package to LAYERS (and the docstring)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    bad = []
    for line, module in _imports(path):
        top = _top(module)
        if top is None or top == own:
            continue
        rank = FRONT_DOOR if top == "__init__" else RANK.get(top)
        if rank is None or rank >= RANK[own]:
            bad.append(f"line {line}: imports {module} ({own} is layer {RANK[own]}, "
                       f"{top} is layer {rank})")
    assert not bad, f"{path.relative_to(PACKAGE)}:\n" + "\n".join(bad)


CORE = {"errors", "_version", "choice", "format", "world", "checkpoint", "storage", "sources",
        "plan", "writer", "read"}


def test_the_core_imports_no_optional_extra_at_import_time() -> None:
    """torch, ray, transformers and megatron are extras: the core may import them inside a
    function (behind MissingExtraError), never when a module loads."""
    bad = [f"{p.relative_to(PACKAGE)} imports {name}"
           for p in _modules() if p.relative_to(PACKAGE).parts[0].removesuffix(".py") in CORE
           for name in _module_level_imports(p)
           if name.split(".")[0] in ("torch", "ray", "transformers", "accelerate",
                                     "megatron", "torchdata", "fsspec", "s3fs", "lightning")]
    assert not bad, "\n".join(bad)


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50  # decorators and docstring included


def _oversize(path: Path) -> list[str]:
    text = path.read_text()
    found = []
    if len(text.splitlines()) > MAX_MODULE_LINES:
        found.append(f"{len(text.splitlines())} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"line {node.lineno}: {node.name}() is {length} lines "
                             f"(at most {MAX_FUNCTION_LINES})")
    return found


def test_no_module_over_400_lines_and_no_function_over_50() -> None:
    """The house limits (docs/DESIGN.md): split along a real seam when one is crossed."""
    bad = [f"{p.relative_to(PACKAGE)}: {problem}"
           for p in sorted(PACKAGE.rglob("*.py"))
           for problem in _oversize(p)]
    assert not bad, "\n".join(bad)


PLANS = PACKAGE / "read" / "orders"
READERS = ("shardwise.read.tokens", "shardwise.read.stream")


def test_plans_import_no_reader() -> None:
    """An order is a plan over a TokenLayout (read/orders): it never sees a reader, so it
    imports none of the readers that build it (read/tokens, read/stream)."""
    bad = [f"{p.relative_to(PACKAGE)} line {line}: imports {module}"
           for p in sorted(PLANS.rglob("*.py")) for line, module in _imports(p)
           if module.startswith(READERS)]
    assert not bad, "\n".join(bad)
