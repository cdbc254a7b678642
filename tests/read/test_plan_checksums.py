"""Plan caches a reader trusts carry a checksum that is checked: a document order zeroed
or reversed, or one flipped byte of any plan file (an order, its token offsets, the
document starts), keeps its dtype, shape and end values, so only the checksum can tell;
the reader rebuilds the file and serves the clean examples, never the edited ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
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
