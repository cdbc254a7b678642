"""Hugging Face ``datasets`` in their usual forms as build sources: a ``save_to_disk``
folder, its ``.arrow`` files, the ``datasets`` cache that ``load_dataset`` fills, a hub
cache snapshot (``datasets--owner--name``) and a ``datasets.Dataset`` each build the same
tokens as the same rows exported to JSONL; ``--text-key meta.body`` reaches nested JSON
objects and Parquet structs; a folder of anything else is refused, naming what it holds.

All data is made here by the real ``datasets`` library (``load_dataset("parquet", …)``
offline, over a file this module writes); nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.conftest import sample_texts, write_jsonl
from tests.helpers_cache import assert_same_cache, cache_documents

import shardwise as sw
from shardwise.errors import ConfigError, InputError
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import Ledger
from shardwise.writer.api import build

ROWS = 60
ARGS: dict[str, Any] = dict(chunk_docs=8, segment_bytes=2048, workers=1, progress=False,
                            append_eod=True)
SHA = "0123456789abcdef0123456789abcdef01234567"


def _hub_repo(root: Path, files: dict[str, bytes]) -> Path:
    """A hub cache entry as ``huggingface_hub`` lays it out: ``blobs/`` holds the bytes,
    ``snapshots/<commit>/`` symlinks to them, ``refs/main`` names the commit."""
    import hashlib

    repo = root / "datasets--someone--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = repo / "snapshots" / SHA / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(Path(name).parts) + 1)) / "blobs" / blob.name)
    return repo


def _datasets_cache(root: Path, data_files: dict[str, str]) -> Path:
    """The folder ``load_dataset`` writes its Arrow files and dataset_info.json into."""
    import datasets

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        datasets.load_dataset("parquet", data_files=data_files, cache_dir=str(root))
    (info,) = root.rglob("dataset_info.json")
    return info.parent


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Any]:
    import datasets

    d = tmp_path_factory.mktemp("hf")
    texts = [t[:240] for t in sample_texts()[:ROWS]]
    bodies = [f"body {i}: {t[::-1][:120]}" for i, t in enumerate(texts)]
    ds = datasets.Dataset.from_dict({"text": texts,
                                     "meta": [{"body": b, "n": i} for i, b in enumerate(bodies)]})
    ds.save_to_disk(str(d / "saved"), max_shard_size="4KB")
    ds.to_parquet(str(d / "rows.parquet"))
    ds.select(range(7)).to_parquet(str(d / "test.parquet"))
    out: dict[str, Any] = {"dir": d, "texts": texts, "bodies": bodies, "tok": tokenizer_path,
                           "saved": d / "saved", "parquet": d / "rows.parquet"}
    out["cache1"] = _datasets_cache(d / "hfcache1", {"train": str(d / "rows.parquet")})
    out["cache2"] = _datasets_cache(d / "hfcache2", {"train": str(d / "rows.parquet"),
                                                     "test": str(d / "test.parquet")})
    parquet = (d / "rows.parquet").read_bytes()
    out["hub"] = _hub_repo(d / "hub", {"data/train-00000-of-00001.parquet": parquet,
                                       "README.md": b"---\nlicense: mit\n---\n",
                                       ".gitattributes": b"*.parquet filter=lfs\n"})
    out["hub2"] = _hub_repo(d / "hub2", {"data/train-00000-of-00001.parquet": parquet,
                                         "data/test-00000-of-00001.parquet":
                                             (d / "test.parquet").read_bytes()})
    out["hub_arrow"] = _hub_repo(d / "hub3", {
        f"train/{f.name}": f.read_bytes() for f in sorted((d / "saved").glob("data-*.arrow"))})
    build([write_jsonl(d / "ref.jsonl", texts)], d / "ref", tokenizer=tokenizer_path, **ARGS)
    build([write_jsonl(d / "body.jsonl", bodies)], d / "body", tokenizer=tokenizer_path,
          **ARGS)
    out["ref"] = cache_documents(d / "ref")
    out["body_ref"] = cache_documents(d / "body")
    return out


def _row_order(out: Path) -> list[list[int]]:
    """A cache's documents in the order of their rows: source by source (the cache
    itself takes the sources' chunks round robin)."""
    cache = sw.open_cache(out)
    docs = iter(cache_documents(cache))
    by_source: dict[int, list[list[int]]] = {}
    for chunk in cache.chunks:
        by_source.setdefault(chunk.source, []).extend(next(docs) for _ in range(chunk.documents))
    return [d for s in sorted(by_source) for d in by_source[s]]


def _docs(hf: dict[str, Any], sources: Any, out: Path, **kw: Any) -> list[list[int]]:
    build(sources, out, tokenizer=hf["tok"], **{**ARGS, **kw})
    return _row_order(out)


def _arrow_files(hf: dict[str, Any]) -> list[Path]:
    files = sorted(hf["saved"].glob("data-*.arrow"))
    assert len(files) > 1  # save_to_disk really sharded it
    return files


def test_a_save_to_disk_folder_builds_the_rows(hf: dict[str, Any], tmp_path: Path) -> None:
    assert _docs(hf, hf["saved"], tmp_path / "c") == hf["ref"]
    paths = [s.path for s in sw.open_cache(tmp_path / "c").manifest.sources]
    assert [Path(p).name for p in paths] == [f.name for f in _arrow_files(hf)]


def test_arrow_files_and_a_glob_of_them(hf: dict[str, Any], tmp_path: Path) -> None:
    assert _docs(hf, _arrow_files(hf), tmp_path / "files", workers=2) == hf["ref"]
    assert _docs(hf, str(hf["saved"] / "data-*.arrow"), tmp_path / "glob") == hf["ref"]
    everything = str(hf["saved"] / "*")  # dataset_info.json and state.json are no data
    assert _docs(hf, everything, tmp_path / "all") == hf["ref"]
    ledger = json.loads((tmp_path / "files" / "ledger.json").read_bytes())
    assert sum(len(s["segments"]) for s in ledger["sources"]) > len(_arrow_files(hf))


def test_a_datasets_object(hf: dict[str, Any], tmp_path: Path) -> None:
    import datasets

    loaded = datasets.load_from_disk(str(hf["saved"]))
    assert _docs(hf, loaded, tmp_path / "c") == hf["ref"]
    assert _docs(hf, [loaded], tmp_path / "list") == hf["ref"]
    in_memory = datasets.Dataset.from_dict({"text": hf["texts"]})
    with pytest.raises(ConfigError, match="save_to_disk"):
        build(in_memory, tmp_path / "m", tokenizer=hf["tok"], **ARGS)
    extra = datasets.Dataset.from_dict({"text": ["x"], "meta": [{"body": "b", "n": 0}]},
                                       features=loaded.features)
    partly = datasets.concatenate_datasets([loaded, extra])  # a row only in memory
    with pytest.raises(ConfigError, match=r"61 rows.*hold 60"):
        build(partly, tmp_path / "p", tokenizer=hf["tok"], **ARGS)
    with pytest.raises(ConfigError, match="flatten_indices"):
        build(loaded.shuffle(seed=1, keep_in_memory=True), tmp_path / "s",
              tokenizer=hf["tok"], **ARGS)


def test_the_datasets_cache_folder(hf: dict[str, Any], tmp_path: Path) -> None:
    import datasets

    train = datasets.Dataset.from_file(str(hf["cache1"] / "parquet-train.arrow"))
    train.map(lambda r: {"text": r["text"].upper()})  # writes cache-….arrow beside it
    assert list(hf["cache1"].glob("cache-*.arrow"))
    assert _docs(hf, hf["cache1"], tmp_path / "c") == hf["ref"]
    with pytest.raises(ConfigError, match=r"(?s)train.*test|test.*train") as e:
        build(hf["cache2"], tmp_path / "two", tokenizer=hf["tok"], **ARGS)
    assert "parquet-train.arrow" in str(e.value)  # what to pass instead
    one = hf["cache2"] / "parquet-train.arrow"
    assert _docs(hf, one, tmp_path / "one") == hf["ref"]
    short = tmp_path / "short"  # dataset_info.json counts a row the files do not hold
    shutil.copytree(hf["cache1"], short)
    info = json.loads((short / "dataset_info.json").read_bytes())
    info["splits"]["train"]["num_examples"] += 1
    (short / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match=r"hold 60 rows, dataset_info.json counts 61"):
        build(short, tmp_path / "s", tokenizer=hf["tok"], **ARGS)


def test_a_cache_root_names_the_dataset_folder_inside(hf: dict[str, Any],
                                                      tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=str(hf["cache1"])):
        build(hf["dir"] / "hfcache1", tmp_path / "c", tokenizer=hf["tok"], **ARGS)


def test_a_hub_cache_snapshot(hf: dict[str, Any], tmp_path: Path) -> None:
    assert _docs(hf, hf["hub"], tmp_path / "repo") == hf["ref"]
    assert _docs(hf, hf["hub"] / "snapshots" / SHA, tmp_path / "snap") == hf["ref"]
    assert _docs(hf, hf["hub_arrow"], tmp_path / "arrow") == hf["ref"]
    with pytest.raises(ConfigError, match=r"(?s)train.*test|test.*train") as e:
        build(hf["hub2"], tmp_path / "two", tokenizer=hf["tok"], **ARGS)
    assert "train-00000-of-00001.parquet" in str(e.value)


def test_the_cli_builds_a_saved_folder_with_a_dotted_key(hf: dict[str, Any], tmp_path: Path,
                                                        cli: Any) -> None:
    code, out, err = cli("build", hf["saved"], "--out", tmp_path / "c", "--tokenizer",
                         hf["tok"], "--text-key", "meta.body", "--chunk-docs", "8",
                         "--append-eod", "--workers", "1", "--no-progress")
    assert code == 0, err
    assert _row_order(tmp_path / "c") == hf["body_ref"]


def test_dotted_keys_reach_nested_json_and_parquet_structs(hf: dict[str, Any],
                                                           tmp_path: Path) -> None:
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps({"meta": {"body": b, "n": i}}) + "\n"
                              for i, b in enumerate(hf["bodies"])))
    assert _docs(hf, nested, tmp_path / "j", text_key="meta.body") == hf["body_ref"]
    assert _docs(hf, hf["parquet"], tmp_path / "p", text_key="meta.body") == hf["body_ref"]
    flat = tmp_path / "flat.parquet"  # datasets' flatten(): a column named "meta.body"
    pq.write_table(pq.read_table(hf["parquet"]).flatten(), flat)
    assert _docs(hf, flat, tmp_path / "f", text_key="meta.body") == hf["body_ref"]


def test_a_missing_nested_field_names_what_is_there(hf: dict[str, Any],
                                                     tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"meta": {"title": "x"}}) + "\n")
    with pytest.raises(InputError, match=r"meta\.body.*title"):
        build(src, tmp_path / "c", tokenizer=hf["tok"], text_key="meta.body", **ARGS)
    with pytest.raises(InputError, match=r"meta\.nope.*body"):
        build(hf["parquet"], tmp_path / "p", tokenizer=hf["tok"], text_key="meta.nope", **ARGS)


def test_a_folder_of_something_else_is_named(hf: dict[str, Any], tmp_path: Path) -> None:
    d = tmp_path / "other"
    d.mkdir()
    (d / "a.csv").write_text("text\nhello\n")
    (d / "b.csv").write_text("text\nhello\n")
    (d / "notes.txt").write_text("hi\n")
    with pytest.raises(ConfigError, match=r"(?s)2 \.csv.*1 \.txt.*save_to_disk.*\.arrow"):
        build(d, tmp_path / "c", tokenizer=hf["tok"], **ARGS)


def test_a_saved_dataset_dict_names_its_splits(hf: dict[str, Any], tmp_path: Path) -> None:
    import datasets

    ds = datasets.load_from_disk(str(hf["saved"]))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"(?s)train.*test.*dd/train"):
        build(tmp_path / "dd", tmp_path / "c", tokenizer=hf["tok"], **ARGS)
    assert _docs(hf, tmp_path / "dd" / "train", tmp_path / "t") == hf["ref"]


def test_an_interrupted_arrow_build_resumes_to_the_same_bytes(hf: dict[str, Any],
                                                             tmp_path: Path) -> None:
    """What a killed build leaves: every segment's ledger entry stops after its first
    chunk (the chunks after it were published or not); the rerun reads each Arrow file
    from the row the ledger names."""
    args = {**ARGS, "chunk_docs": 3, "segment_bytes": 1 << 20}  # a segment per file
    full = tmp_path / "full"
    build(hf["saved"], full, tokenizer=hf["tok"], **args)
    part = tmp_path / "part"
    shutil.copytree(full, part)
    ledger = Ledger.load(LocalFiles(part))
    cache = sw.open_cache(part)
    cut = 0
    for src in ledger.sources:
        for seg in src.segments:
            if len(seg.chunks) > 1:
                meta = cache.meta([c.stem for c in cache.chunks].index(seg.chunks[0].stem))
                seg.position, seg.line = meta.range.stop, meta.range.line_stop
                seg.chunks, seg.finished = seg.chunks[:1], False
                cut += 1
    assert cut > 1
    ledger.save(LocalFiles(part))
    (part / "ledger.index").unlink(missing_ok=True)
    summary = build(hf["saved"], part, tokenizer=hf["tok"], **args)
    assert summary.new_chunks > cut
    assert_same_cache(full, part)


def test_trace_names_an_arrow_row(hf: dict[str, Any], tmp_path: Path, cli: Any) -> None:
    from tokenizers import Tokenizer

    from shardwise.read.config import ReadConfig
    from shardwise.read.trace import Tracer

    build(hf["saved"], tmp_path / "c", tokenizer=hf["tok"], **ARGS)
    raw = {"cache": str(tmp_path / "c"), "seq_len": 24, "seed": 3, "global_batch_size": 4,
           "micro_batch_size": 2, "world_size": 2}
    cfg = ReadConfig.from_dict(raw)
    tok = Tokenizer.from_file(str(hf["tok"]))
    eod = sw.open_cache(tmp_path / "c").eod_id
    rows = {f.name: pa.ipc.open_stream(f.read_bytes()).read_all().column("text").to_pylist()
            for f in _arrow_files(hf)}
    named = 0
    for k in range(3):
        for ex in Tracer(cfg, ids=True).step(k).examples:
            for p in ex.pieces:
                w = p.where
                assert w.unit == "row" and w.line is None and w.row is not None
                assert w.label() == f"{w.source_path} row {w.row}"
                text = rows[Path(w.source_path).name][w.row]
                doc = [*tok.encode(text, add_special_tokens=False).ids, eod]
                assert p.ids == doc[p.doc_offset: p.doc_offset + p.tokens]
                named += 1
    assert named > 0
    (tmp_path / "read.json").write_text(json.dumps(raw))
    code, out, err = cli("trace", tmp_path / "read.json", "--step", "1")
    assert code == 0, err
    assert f"{hf['saved']}/data-0000" in out and ".arrow row " in out


@pytest.mark.parametrize(("start", "stop"), [(0, -1), (2999, 3001), (4095, 9000), (9999, -1),
                                             (10_000, -1), (0, 0), (5000, 9097)])
def test_arrow_rows_from_any_position(tmp_path: Path, start: int, stop: int) -> None:
    """Rows [start, stop) of a file of batches of 3000 (sliced 4096 at a time)."""
    from shardwise.sources.arrow import arrow_rows, iter_arrow

    table = pa.table({"i": list(range(10_000))})
    with pa.ipc.new_stream(str(tmp_path / "x.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=3000)
    got = list(iter_arrow(str(tmp_path / "x.arrow"), start, stop))
    assert [r for _, r in got] == list(range(start, 10_000 if stop < 0 else stop))
    assert all(rec == {"i": r} for rec, r in got)
    assert arrow_rows(str(tmp_path / "x.arrow")) == 10_000
