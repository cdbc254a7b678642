"""One lifecycle for process-local resources: made on first use in a process, never
pickled, forgotten by a forked child (never closed there), closed once."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from shardwise.concurrency.local import ProcessLocal


class Resource:
    """Records the process that made it and how often it was closed."""

    made = 0

    def __init__(self) -> None:
        Resource.made += 1
        self.pid = os.getpid()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Owner:
    def __init__(self) -> None:
        self.res = ProcessLocal(Resource, name="resource")


def test_made_once_on_first_use_and_closed_once() -> None:
    before = Resource.made
    owner = Owner()
    assert owner.res.made is None and Resource.made == before  # nothing made yet
    first = owner.res.get()
    assert owner.res.get() is first and Resource.made == before + 1
    owner.res.close()
    owner.res.close()  # nothing left to close
    assert first.closed == 1 and owner.res.made is None
    assert owner.res.get() is not first  # made again on the next use


def test_a_pickled_copy_carries_the_factory_not_the_value() -> None:
    owner = Owner()
    made = owner.res.get()
    copy = pickle.loads(pickle.dumps(owner))
    assert copy.res.made is None
    assert copy.res.get() is not made and isinstance(copy.res.get(), Resource)
    assert made.closed == 0 and owner.res.get() is made


def _in_child(owner: Owner, parents: Resource, out: Any) -> None:
    inherited = owner.res.made  # the parent's value is not this process's
    owner.res.close()  # closes nothing of the parent's
    mine = owner.res.get()
    out.put((inherited is None, parents.closed, mine is not parents, mine.pid == os.getpid()))


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_a_value_made_before_fork_is_not_used_in_the_child() -> None:
    owner = Owner()
    parents = owner.res.get()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(owner, parents, out))
    child.start()
    got = out.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert got == (True, 0, True, True)
    assert owner.res.get() is parents and parents.closed == 0  # the parent's is untouched


def test_a_value_made_now_is_none_elsewhere() -> None:
    local = ProcessLocal.now([1, 2], name="workers")
    assert local.get() == [1, 2]
    copy = pickle.loads(pickle.dumps(local))
    assert copy.made is None
    with pytest.raises(RuntimeError, match="workers belongs to the process that made it"):
        copy.get()


def test_values_that_stop_at_exit_are_stopped_once(tmp_path: Path) -> None:
    mark = tmp_path / "closed"
    code = textwrap.dedent(f"""
        from shardwise.concurrency.local import ProcessLocal

        class Res:
            def close_at_exit(self, timeout):
                with open({str(mark)!r}, "a") as f:
                    f.write(f"closed {{timeout:g}}\\n")

        local = ProcessLocal(Res)
        local.get()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert mark.read_text() == "closed 10\n"  # once, with shutdown's JOIN_SECONDS
