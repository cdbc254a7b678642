"""Hostile values that crashed (CLI exit 4 "internal error", or a raw exception) are
shardwise errors naming their file, CLI exit 2 (issue 27, finding 5). A NUL in a stem:
tests/format/test_hostile_ledger.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tests.cachefactory import make_cache, sample_docs
from tests.format.test_hostile_ledger import examples

import shardwise as sw
from shardwise.errors import CorruptChunkError, InputError, ManifestError, StateError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.ledger import JOURNAL_DIR, LEDGER_NAME
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.read.config import ReadConfig

META = "chunks/00000/00000-00001.json"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cache(tmp_path_factory.mktemp("named") / "c", [sample_docs(20, seed=5)],
                      chunk_docs=4)


@pytest.fixture
def cache(clean: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean, tmp_path / "c"))


def rewrite_json(path: Path, edit: Any) -> bytes:
    d = orjson.loads(path.read_bytes())
    edit(d)
    path.write_bytes(orjson.dumps(d, option=orjson.OPT_SORT_KEYS))
    return path.read_bytes()


def covered(root: Path, **xxh3: str) -> None:
    """A hostile author's edit: the ledger's checksums made to match (chunk 1's
    ``meta_xxh3``, the ``manifest_xxh3``); the index then names other bytes (stale)."""
    def edit(d: dict[str, Any]) -> None:
        if "meta" in xxh3:
            d["sources"][0]["segments"][0]["chunks"][1]["meta_xxh3"] = xxh3["meta"]
        if "manifest" in xxh3:
            d["manifest_xxh3"] = xxh3["manifest"]
    rewrite_json(root / LEDGER_NAME, edit)


def test_a_journal_file_named_with_a_non_ascii_digit_is_not_a_record(cache: Path,
                                                                     clean: Path) -> None:
    (cache / JOURNAL_DIR).mkdir()
    (cache / JOURNAL_DIR / "².json").write_bytes(b"{}")  # str.isdigit() says True
    assert examples(cache) == examples(clean)


def test_chunk_metadata_listing_no_files_is_named(cache: Path, cli) -> None:
    data = rewrite_json(cache / META, lambda d: d.update(files=[]))
    covered(cache, meta=bytes_checksum(data))
    with pytest.raises(CorruptChunkError, match=rf"{META}: not valid chunk metadata"):
        examples(cache)  # found by the background verification
    with pytest.raises(CorruptChunkError, match=rf"{META}: not valid chunk metadata"):
        sw.open_cache(cache).meta(1)
    code, out, _ = cli("verify", cache)
    assert code == 1 and f"BAD {cache / META}: not valid chunk metadata" in out


def test_a_float_token_dtype_in_the_manifest_is_named(cache: Path, cli) -> None:
    data = rewrite_json(cache / MANIFEST_NAME, lambda d: d.update(dtype="float64"))
    covered(cache, manifest=bytes_checksum(data))
    with pytest.raises(ManifestError, match=rf"{MANIFEST_NAME}: .*'float64' is not an "
                                            "integer token dtype"):
        examples(cache)
    code, _, err = cli("inspect", cache)
    assert code == 2 and str(cache / MANIFEST_NAME) in err and "internal error" not in err
    code, out, _ = cli("verify", cache)
    assert code == 1 and f"BAD {cache / MANIFEST_NAME}" in out


@pytest.mark.parametrize("body", [b"", b"PAR1 but not a footer " * 9])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_unreadable_parquet_source_is_named(tmp_path: Path, tokenizer_path: Path, cli,
                                               body: bytes, on_error: str) -> None:
    """A whole file that is not Parquet has no records to skip and count: refused under
    --on-error skip too (sources/on_error.py), naming the file."""
    src = tmp_path / "bad.parquet"
    src.write_bytes(body)
    with pytest.raises(InputError, match=rf"{src}: not a readable Parquet file") as e:
        sw.build([src], tmp_path / "out", tokenizer=tokenizer_path, on_error=on_error,
                 progress=False, workers=1)
    assert e.value.path == str(src) and e.value.reason == "unreadable_file"
    code, _, err = cli("build", src, "--out", tmp_path / "out2", "--tokenizer",
                       tokenizer_path, "--on-error", on_error)
    assert code == 2 and f"{src}: not a readable Parquet file" in err


def _nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


@pytest.mark.parametrize("config", [[1, 2], "abc", [["seed", 1]], _nested(1000)],
                         ids=["list", "string", "pairs", "1000-deep"])
def test_a_state_whose_config_is_not_an_object_is_named(clean: Path, config: Any) -> None:
    from shardwise.torch import loader

    def make() -> Any:
        ds = sw.TokenDataset(sw.open_cache(clean), seq_len=16, seed=1)
        return loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))

    dl = make()
    next(iter(dl))
    state = {**dl.state_dict(), "config": config}
    with pytest.raises(StateError, match=r"state config (is|nests)"):
        make().load_state_dict(state)
    with pytest.raises(StateError, match=r"state config (is|nests)"):
        ReadConfig.from_state(state, cache=str(clean), global_batch_size=4,
                              micro_batch_size=2, world_size=1)
    stream = sw.StreamDataset(sw.open_cache(clean), seq_len=16, seed=1, streams=1,
                              world=sw.World(0, 1))
    bad = {**stream.state_dict(), "config": config}
    with pytest.raises(StateError, match=r"state config (is|nests)"):
        stream.load_state_dict(bad)
    assert np.asarray(next(iter(stream))["input_ids"]).shape == (16,)
    assert (clean / INDEX_NAME).exists()
