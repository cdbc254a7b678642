"""Plan caches a reader trusts carry a checksum that is checked: a document order zeroed
or reversed, or one flipped byte of any plan file (an order, its token offsets, the
document starts), keeps its dtype, shape and end values, so only the checksum can tell;
the reader rebuilds the file and serves the clean examples, never the edited ones."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import CacheError
from shardwise.format.checksum import file_checksum
from shardwise.format.paths import READER_DIR

L = 16
EXAMPLES = [0, 1, 2, 7]


def _examples(root: Path) -> list[np.ndarray]:
    ds = sw.TokenDataset(root, seq_len=L, seed=5, shuffle="document", verify=False)
    return [ds[i]["input_ids"] for i in EXAMPLES]


def _edit(path: Path, how: str) -> None:
    """Change ``path``'s values in place, keeping its header (dtype, shape)."""
    with open(path, "r+b") as f:
        npy.read_magic(f)
        shape, _, dtype = npy.read_array_header_1_0(f)
        at = f.tell()
        values = np.fromfile(f, dtype=dtype)
        if how == "zero":
            values[:] = 0
        elif how == "reverse":
            values = values[::-1].copy()
        else:  # one byte in the middle: the ends stay as they were
            raw = bytearray(values.tobytes())
            raw[len(raw) // 2] ^= 0x10
            values = np.frombuffer(bytes(raw), dtype=dtype)
        f.seek(at)
        f.write(values.tobytes())


CASES = [("doc_order", "zero"), ("doc_order", "reverse"), ("doc_order", "flip"),
         ("cum_tokens", "flip"), ("doc_starts", "flip")]


@pytest.mark.parametrize(("name", "how"), CASES)
def test_an_edited_plan_file_is_rebuilt_and_never_used(tmp_path: Path, name: str,
                                                       how: str) -> None:
    root = make_cache(tmp_path / "cache", [sample_docs(60, seed=4)], chunk_docs=7)
    clean = _examples(root)
    (path,) = (root / READER_DIR).glob(f"*.{name}.npy")
    good = path.read_bytes()
    _edit(path, how)
    assert path.read_bytes() != good
    again = _examples(root)
    for i, a, b in zip(EXAMPLES, clean, again, strict=True):
        assert np.array_equal(a, b), f"example {i} differs after {how} of {name}"
    assert path.read_bytes() == good  # rebuilt, under its lock


def test_a_forged_plan_with_its_own_checksums_is_rebuilt(tmp_path: Path) -> None:
    """A plan shipped inside a cache: the order reversed, the token offsets made to agree
    with it, and both checksums recorded in its metadata. The checksums pass; the order is
    not the seed's permutation where the reader samples it, so it is rebuilt."""
    root = make_cache(tmp_path / "cache", [sample_docs(60, seed=4)], chunk_docs=7)
    clean = _examples(root)
    (meta_path,) = (root / READER_DIR).glob("*[0-9a-f].json")
    fp, plans = meta_path.name[:-len(".json")], meta_path.parent
    order = np.load(plans / f"{fp}.doc_order.npy")
    cum = np.load(plans / f"{fp}.cum_tokens.npy")
    lengths = np.diff(cum)[np.argsort(order)]  # by stored document
    forged = order[::-1].copy()
    np.save(plans / f"{fp}.doc_order.npy", forged)
    np.save(plans / f"{fp}.cum_tokens.npy", np.concatenate(([0], np.cumsum(lengths[forged]))))
    meta = json.loads(meta_path.read_text())
    meta["xxh3_64"] = {name: file_checksum(plans / f"{fp}.{name}.npy")
                       for name in ("doc_order", "cum_tokens")}
    meta_path.write_text(json.dumps(meta))
    again = _examples(root)
    for i, a, b in zip(EXAMPLES, clean, again, strict=True):
        assert np.array_equal(a, b), f"example {i} differs with a forged plan"
    assert np.array_equal(np.load(plans / f"{fp}.doc_order.npy"), order)  # rebuilt


def _unless_hung(path: Path, job: Callable[[], object]) -> None:
    """``job()`` on a thread, re-raising what it raised; a failure if it blocks (then the
    FIFO ``path`` is opened for writing and closed, so the blocked reader sees its end)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            failed.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        t.join(30)
        pytest.fail(f"the reader blocked opening the FIFO {path.name}")
    if failed:
        raise failed[0]


@pytest.mark.parametrize("name", ["doc_order.npy", "cum_tokens.npy", "plan json",
                                  "doc_starts.npy", "doc_starts.json"])
def test_a_fifo_planted_as_a_plan_file_is_refused_without_hanging(tmp_path: Path,
                                                                  name: str) -> None:
    """A cache shipped with a FIFO where a plan file goes: opening it to read would block
    until someone writes to it. It is a CacheError naming it, at once. (The starts are
    read by the plan's builder: their case removes the plan first.)"""
    root = make_cache(tmp_path / "cache", [sample_docs(60, seed=4)], chunk_docs=7)
    _examples(root)
    plans = root / READER_DIR
    (meta,) = plans.glob("*[0-9a-f].json")
    (path,) = [meta] if name == "plan json" else plans.glob(f"*.{name}")
    if name.startswith("doc_starts"):
        meta.unlink()
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CacheError, match=f"{path.name} is not a regular file"):
        _unless_hung(path, lambda: _examples(root))


@pytest.mark.parametrize("value", [None, "x", [], 1.5])
def test_a_plan_whose_metadata_holds_a_value_of_another_type_is_rebuilt(
        tmp_path: Path, value: object) -> None:
    """Found by the long fuzz run: ``"seq_len": null`` in a plan's metadata was a raw
    TypeError (``int(None)``), not a damaged plan rebuilt."""
    root = make_cache(tmp_path / "cache", [sample_docs(60, seed=4)], chunk_docs=7)
    clean = _examples(root)
    (meta_path,) = (root / READER_DIR).glob("*[0-9a-f].json")
    meta = json.loads(meta_path.read_text())
    meta["seq_len"] = value
    meta_path.write_text(json.dumps(meta))
    for a, b in zip(clean, _examples(root), strict=True):
        assert np.array_equal(a, b)
