"""Framework knowledge lives in integrations/ (issue 22 item 5): read/ holds the hook every
reader calls and the frame walks, never a framework's class name. An architecture test, as
tests/test_layers.py: it reads the source (code, not docstrings: prose may explain what a
guard is for) and the registry that ``import shardwise`` fills."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardwise
from shardwise.errors import ConfigError
from shardwise.integrations import guards as integration_guards
from shardwise.read import guard

READ = Path(shardwise.__file__).parent / "read"


def _framework_names() -> set[str]:
    names = {w.name for w in integration_guards.WRAPPERS}
    names |= {t.qualname.split(".")[0] for t in integration_guards.TRAINERS}
    names |= set(integration_guards.LIGHTNING_FETCHERS) | {integration_guards.LIGHTNING_WRAPPER}
    return names | {"accelerate", "lightning", "trl", "transformers"}


def _code_words(path: Path) -> set[str]:
    """Every identifier and every word of a non-docstring string constant in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and (body := node.body) and isinstance(body[0], ast.Expr)
                  and isinstance(body[0].value, ast.Constant)}
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.alias):
            words |= set(node.name.split("."))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            words |= {w.strip("`'\"().,:;[]") for w in node.value.replace(".", " ").split()}
    return words


@pytest.mark.parametrize("path", sorted(READ.rglob("*.py")), ids=lambda p: str(p.relative_to(READ)))
def test_read_holds_no_framework_class_name(path: Path) -> None:
    found = _code_words(path) & _framework_names()
    assert not found, (f"read/{path.relative_to(READ)} names {sorted(found)} in its code: "
                       "framework knowledge goes in shardwise/integrations/guards.py "
                       "(registered with read/guard.py's registry)")


def test_the_word_check_sees_code() -> None:
    """The check above finds a name in a string or an identifier, not in a docstring."""
    src = READ / "guard.py"
    assert "GUARDS" in _code_words(src) and "register_guard" in _code_words(src)
    assert "BatchSamplerShard" not in _code_words(src)  # its docstring names it


def test_every_framework_guard_is_registered_by_import_shardwise_alone() -> None:
    """A program that never imports an integration (a stock HF Trainer / accelerate /
    Lightning / TRL user) gets every guard: the front door registers them."""
    code = ("import shardwise.read.guard as g, shardwise.integrations.guards as i; "
            "assert set(g.GUARDS) == {w.name for w in i.WRAPPERS} | "
            "{t.qualname for t in i.TRAINERS}, sorted(g.GUARDS)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_guard_under_a_taken_name_is_refused() -> None:
    known: dict[str, guard.Wrapper | guard.ForeignTrainer] = {}
    w = guard.Wrapper("SomeShard", "someframework", "use the reader directly")
    guard.register_guard(w, known)
    guard.register_guard(w, known)  # the same again: a no-op
    assert known == {"SomeShard": w}
    with pytest.raises(ConfigError, match="'SomeShard' is already registered"):
        guard.register_guard(guard.Wrapper("SomeShard", "other", "fix"), known)


class ReplayShard:
    """A framework's wrapper that would shard what it iterates (matched by class name)."""

    def __init__(self, inner: object, num_processes: int = 2) -> None:
        self.inner, self.num_processes = inner, num_processes

    def __iter__(self) -> Iterator[object]:
        yield from self.inner  # type: ignore[misc]


def test_a_registered_wrapper_is_refused_by_a_reader(tmp_path: Path) -> None:
    """The hook is generic: a wrapper class registered from outside read/ is refused when it
    iterates a reader, naming its framework and fix."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cachefactory import make_cache, sample_docs

    cache = make_cache(tmp_path / "cache", [sample_docs(6, seed=5, vocab_size=500)],
                       chunk_docs=3, eod_id=0)
    ds = shardwise.StreamDataset(cache, seq_len=8, streams=1, seed=1)
    spans = integration_guards.WRAPPERS[0].spans  # num_processes > 1
    guard.register_guard(guard.Wrapper("ReplayShard", "replayer", "iterate it directly",
                                       spans=spans))
    try:
        with pytest.raises(ConfigError, match="replayer's ReplayShard.*iterate it directly"):
            next(iter(ReplayShard(ds)))
        assert next(iter(ReplayShard(ds, num_processes=1)))  # over one process: no sharding
        next(iter(ds))  # not wrapped: read
    finally:
        del guard.GUARDS["ReplayShard"]


# modules that still list imported names in __all__, each with why it is allowed for now
REEXPORTS_ALLOWED = {
    "read/external/producer_dir.py": "README documents `from shardwise.read.external."
    "producer_dir import publish_chunk` (the producer's half next to its reader); moving "
    "users to read/external/producer.py is a user-visible change",
    "read/orders/none.py": "PAD, from orders/base.py; read/orders is being reworked (issue "
    "22 item 1)",
    "bench/read.py": "the bench harness is moving out of the package (issue 22 item 6)",
}
FRONT_DOORS = {"__init__.py", "torch.py", "hf.py", "lightning.py", "torchdata.py",
               "megatron.py"}


def _reexports(path: Path) -> list[str]:
    """Names in ``path``'s ``__all__`` that it imports rather than defines."""
    tree = ast.parse(path.read_text(), str(path))
    imported = {a.asname or a.name for node in tree.body
                if isinstance(node, ast.Import | ast.ImportFrom) for a in node.names}
    exported: list[str] = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__all__"):
            exported = list(ast.literal_eval(node.value))
    return [n for n in exported if n in imported]


def test_no_module_re_exports_what_another_defines() -> None:
    """A split leaves no shim behind: callers import a name from the module that defines
    it. Package ``__init__`` files and the public shortcuts (``shardwise.torch``, ...) are
    front doors and may."""
    package = Path(shardwise.__file__).parent
    bad = {str(p.relative_to(package)): names for p in sorted(package.rglob("*.py"))
           if p.name not in FRONT_DOORS or (p.parent != package and p.name != "__init__.py")
           if (names := _reexports(p))}
    for allowed in REEXPORTS_ALLOWED:
        assert allowed in bad, f"{allowed} re-exports nothing any more: drop its exception"
        del bad[allowed]
    assert not bad, f"re-export shims (import these from the defining module): {bad}"
