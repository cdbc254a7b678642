"""Framework knowledge lives in integrations/ (issue 22 item 5): read/ holds the hook every
reader calls and the frame walks, never a framework's class name. An architecture test, as
tests/test_layers.py: it reads the source (code, not docstrings: prose may explain what a
guard is for) and the registry that ``import shardwise`` fills."""

from __future__ import annotations

import ast
import contextlib
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
            "assert set(g.GUARDS) == {g.guard_key(x) for x in (*i.WRAPPERS, *i.TRAINERS, "
            "*i.UNPLACED_FIXES)}, sorted(g.GUARDS)")
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


@contextlib.contextmanager
def _replay_registered() -> Iterator[None]:
    """ReplayShard registered as a wrapper spanning processes, for the block's time."""
    spans = integration_guards.WRAPPERS[0].spans  # num_processes > 1
    guard.register_guard(guard.Wrapper("ReplayShard", "replayer", "iterate it directly",
                                       spans=spans))
    try:
        yield
    finally:
        del guard.GUARDS["ReplayShard"]


def test_a_registered_wrapper_is_refused_by_a_reader(tmp_path: Path) -> None:
    """The hook is generic: a wrapper class registered from outside read/ is refused when it
    iterates a reader, naming its framework and fix."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cachefactory import make_cache, sample_docs

    cache = make_cache(tmp_path / "cache", [sample_docs(6, seed=5, vocab_size=500)],
                       chunk_docs=3, eod_id=0)
    ds = shardwise.StreamDataset(cache, seq_len=8, streams=1, seed=1)
    with _replay_registered():
        with pytest.raises(ConfigError, match="replayer's ReplayShard.*iterate it directly"):
            next(iter(ReplayShard(ds)))
        assert next(iter(ReplayShard(ds, num_processes=1)))  # over one process: no sharding
        next(iter(ds))  # not wrapped: read


@pytest.mark.parametrize("make", ["numpy", "torch"])
def test_a_wrapper_iterating_a_loader_that_makes_batches_ahead_is_refused(
        tmp_path: Path, make: str) -> None:
    """The index stream is started on the caller's thread, not on the made-ahead
    thread's: the guard looks at the frames of whoever iterates the loader."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cachefactory import make_cache, sample_docs
    from shardwise.torch import loader as torch_loader

    cache = make_cache(tmp_path / "cache", [sample_docs(12, seed=5, vocab_size=500)],
                       chunk_docs=3, eod_id=0)
    ds = shardwise.TokenDataset(cache, seq_len=8, seed=1)
    build = shardwise.numpy_loader if make == "numpy" else torch_loader
    dl = build(ds, global_batch_size=2, micro_batch_size=2, world=shardwise.World(0, 1),
               batches_ahead=2)
    with _replay_registered():
        with pytest.raises(ConfigError, match="replayer's ReplayShard"):
            next(iter(ReplayShard(dl)))
        assert next(iter(dl))["input_ids"].shape == (2, 8)  # not wrapped: read


FRONT_DOORS = {"__init__.py", "torch.py", "hf.py", "lightning.py", "torchdata.py",
               "torchtitan.py", "litgpt.py", "megatron.py", "olmo.py", "grain.py"}
PACKAGE = Path(shardwise.__file__).parent
TESTS = Path(__file__).resolve().parent


def _is_front_door(path: Path, package: Path) -> bool:
    """Package ``__init__`` files and the public shortcuts (``shardwise.torch``, ...)."""
    return path.name == "__init__.py" or (path.parent == package and path.name in FRONT_DOORS)


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


def _defined(path: Path) -> set[str]:
    """The names ``path`` binds at module level other than by importing them."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t)
                             if isinstance(n, ast.Name))
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return names


def _module_file(module: str, package: Path) -> Path | None:
    """The file of ``module`` when it is a plain module of ``package`` (no front door)."""
    if not module.startswith(package.name + "."):
        return None
    source = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return source if source.is_file() and not _is_front_door(source, package) else None


def _borrowed_imports(path: Path, package: Path) -> list[str]:
    """``from <package>.m import X`` (or ``m.X`` with ``m`` a module imported whole) in
    ``path`` where module ``m`` (no front door) does not define ``X`` itself: ``X`` is
    taken through a module that only imports it."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, Path] = {}  # a plain module imported whole, by its local name
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if whole := _module_file(f"{node.module}.{a.name}", package):
                    aliases[a.asname or a.name] = whole
            if source := _module_file(node.module, package):
                defined = _defined(source)
                bad += [f"line {node.lineno}: {a.name} from {node.module}"
                        for a in node.names if a.name not in defined]
        elif isinstance(node, ast.Import):
            aliases |= {a.asname: whole for a in node.names
                        if a.asname and (whole := _module_file(a.name, package))}
    patched = {(n.args[0].id, n.args[1].value) for n in ast.walk(tree)  # setattr(m, "X", ...)
               if isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)
               and getattr(n.func, "attr", getattr(n.func, "id", None)) == "setattr"
               and len(n.args) > 1 and isinstance(n.args[0], ast.Name)
               and isinstance(n.args[1], ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and (source := aliases.get(node.value.id))
                and node.attr not in _defined(source)
                and (node.value.id, node.attr) not in patched):  # the binding a test patches
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_no_module_re_exports_what_another_defines() -> None:
    """A split leaves no shim behind: no module lists in ``__all__`` a name it imports.
    Package ``__init__`` files and the public shortcuts (``shardwise.torch``, ...) are
    front doors and may."""
    bad = {str(p.relative_to(PACKAGE)): names for p in sorted(PACKAGE.rglob("*.py"))
           if not _is_front_door(p, PACKAGE) if (names := _reexports(p))}
    assert not bad, f"re-export shims (import these from the defining module): {bad}"


@pytest.mark.parametrize("root", [PACKAGE, TESTS], ids=["src", "tests"])
def test_every_import_names_the_defining_module(root: Path) -> None:
    """A shim without ``__all__`` is a shim too: the library and its tests import each name
    from the module that defines it (or from a front door), never through a module that
    merely imported it."""
    bad = {str(p.relative_to(root)): found for p in sorted(root.rglob("*.py"))
           if (found := _borrowed_imports(p, PACKAGE))}
    assert not bad, f"import these from the module that defines them: {bad}"


def test_the_shim_checks_see_a_shim(tmp_path: Path) -> None:
    """Both checks above find a re-export, in ``__all__`` and through an import, and let a
    package's ``__init__`` (a front door) be."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "base.py").write_text("X = 1\n\ndef f():\n    pass\n")
    (package / "shim.py").write_text("from pkg.base import X\n\nY = X\n__all__ = ['X', 'Y']\n")
    (package / "sub" / "__init__.py").write_text("from pkg.base import X\n__all__ = ['X']\n")
    user = tmp_path / "user.py"
    user.write_text("from pkg.shim import X, Y\nfrom pkg.base import f\nfrom pkg.sub import X\n"
                    "from pkg import shim\nimport pkg.base as b\nshim.Y, b.X, b.Z\n"
                    "real = shim.X\nmonkeypatch.setattr(shim, 'X', 2)\n")
    assert _reexports(package / "shim.py") == ["X"]
    assert _is_front_door(package / "sub" / "__init__.py", package)
    assert _borrowed_imports(user, package) == ["line 1: X from pkg.shim", "line 6: b.Z"]
    user.write_text("from pkg import shim\nshim.X\n")  # not patched: borrowed
    assert _borrowed_imports(user, package) == ["line 2: shim.X"]
