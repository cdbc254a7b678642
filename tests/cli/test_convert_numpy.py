"""``shardwise convert --from-numpy`` (issue 29, item 4a): OLMo's EOS-delimited token
arrays become a cache with the identical tokens, documents split after each EOS (kept),
and OLMo-core's own ``NumpyFSLDataset`` reads the cache converted back to Megatron."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.format.megatron import read_idx

EOS, VOCAB = 7, 300


def _olmo_array(rng: np.random.Generator, docs: int, *, tail: int = 0) -> np.ndarray:
    """``docs`` documents of ids != EOS, each followed by EOS; ``tail`` ids after the last."""
    parts = []
    for _ in range(docs):
        body = rng.integers(8, VOCAB, size=int(rng.integers(0, 40)))
        parts += [body, [EOS]]
    parts.append(rng.integers(8, VOCAB, size=tail))
    return np.concatenate(parts).astype(np.uint32)


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, np.ndarray]]:
    """Two raw memmaps as Dolma writes them (``.npy`` name, no header; the second does
    not end with EOS) and one real ``.npy``."""
    root, rng = tmp_path_factory.mktemp("olmo-arrays"), np.random.default_rng(4)
    a, b, c = _olmo_array(rng, 50), _olmo_array(rng, 31, tail=5), _olmo_array(rng, 12)
    a.tofile(root / "part-0-00000.npy")
    b.tofile(root / "part-1-00000.npy")
    np.save(root / "part-2.npy", c)
    return [(root / "part-0-00000.npy", a), (root / "part-1-00000.npy", b),
            (root / "part-2.npy", c)]


def _cache_documents(cache_dir: Path, source: int) -> list[np.ndarray]:
    """The documents of one source (one array) of the cache, in order, from its chunks."""
    cache, out = sw.open_cache(cache_dir), []
    for info in cache.chunks:
        if info.source != source:
            continue
        idx = read_idx(f"{info.base}.idx")
        tokens = np.fromfile(f"{info.base}.bin", dtype=idx.dtype)
        bounds = np.concatenate([[0], np.cumsum(idx.sequence_lengths)])
        out += [tokens[x:y] for x, y in zip(bounds[:-1], bounds[1:], strict=True)]
    return out


def test_tokens_and_documents_are_the_arrays(cli, arrays, tmp_path: Path) -> None:
    code, out, _ = cli("convert", "--from-numpy", *[p for p, _ in arrays], "--eos", str(EOS),
                       "--dtype", "uint32", "--out", tmp_path / "c", "--chunk-docs", "9")
    assert code == 0, out
    assert "5 tokens after the last EOS" in out  # the second file's tail: counted, kept
    for s, (_, array) in enumerate(arrays):  # one source per array (chunks round robin)
        docs = _cache_documents(tmp_path / "c", s)
        assert np.array_equal(np.concatenate(docs), array)  # identical tokens, same order
        whole = [d for d in docs if d[-1] == EOS and EOS not in d[:-1]]
        assert len(whole) == len(docs) - (s == 1) == (50, 31, 12)[s]  # split at each EOS
    assert EOS not in _cache_documents(tmp_path / "c", 1)[-1]  # the tail: no EOS
    cache = sw.open_cache(tmp_path / "c")
    flat = np.concatenate([a for _, a in arrays])
    assert cache.eod_id == EOS and cache.dtype == np.int32  # Megatron's type for uint32 ids
    assert [s.format for s in cache.manifest.sources] == ["numpy"] * 3
    assert len(sw.TokenDataset(cache, seq_len=16)) == (len(flat) - 1) // 16  # every token
    # trace names the file and the document (row) of each example (it raised on the
    # 'numpy' source format before)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"cache": str(tmp_path / "c"), "reader": "tokens",
                                  "seq_len": 16, "seed": 1, "global_batch_size": 4,
                                  "micro_batch_size": 2, "world_size": 2}))
    code, out, err = cli("trace", config, "--step", "0")
    assert code == 0, err
    assert ".npy row " in out, out


def test_olmo_reads_the_cache_converted_to_megatron(cli, arrays, tmp_path: Path) -> None:
    from olmo_core.data.numpy_dataset import NumpyFSLDataset

    path, array = arrays[0]
    cli("convert", "--from-numpy", path, "--eos", str(EOS), "--dtype", "uint32", "--out",
        tmp_path / "c", "--chunk-docs", "4")
    code, out, _ = cli("convert", tmp_path / "c", "--to-megatron", tmp_path / "m" / "corpus")
    assert code == 0, out
    seq = 32
    ds = NumpyFSLDataset(str(tmp_path / "m" / "corpus.bin"), sequence_length=seq,
                         pad_token_id=0, eos_token_id=EOS, vocab_size=VOCAB, dtype=np.uint32)
    ds.work_dir = tmp_path / "olmo-work"
    ds.prepare()
    assert len(ds) == len(array) // seq
    for i in range(len(ds)):
        got = ds[i]["input_ids"].numpy()
        assert np.array_equal(got, array[i * seq:(i + 1) * seq]), f"OLMo instance {i}"


def test_usage_errors_name_the_fix(cli, arrays, tmp_path: Path) -> None:
    raw = arrays[0][0]
    code, _, err = cli("convert", "--from-numpy", raw, "--out", tmp_path / "x")
    assert code == 2 and "--eos ID" in err
    code, out, err = cli("convert", "--from-numpy", raw, "--eos", "7", "--out", tmp_path / "y")
    assert code != 0 and "--dtype uint32" in out + err  # a raw array: its dtype is needed
    code, out, err = cli("convert", "--from-numpy", arrays[2][0], "--eos", "7", "--dtype",
                         "uint16", "--out", tmp_path / "z")
    assert code != 0 and "header says uint32" in out + err
