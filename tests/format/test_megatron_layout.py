"""Shardwise token chunks are Megatron IndexedDataset files, byte for byte.

The reader and writer below are written from the documented layout with ``struct`` and
numpy only, independently of ``shardwise.format.megatron``, so a shared misreading of the
format cannot make both sides agree. When megatron-core is installed
(``pip install --no-deps megatron-core==0.16.1``), Megatron's own ``IndexedDataset``
reads shardwise chunks too.
"""

from __future__ import annotations

import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import shardwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

MAGIC = b"MMIDIDX\x00\x00"
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
         7: np.float32, 8: np.uint16}


def read_megatron(prefix: Path) -> tuple[np.dtype, list[np.ndarray], np.ndarray]:
    """(dtype, one array per sequence, document indices) parsed from the raw bytes."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == MAGIC
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    off = 9 + 8 + 1 + 8 + 8
    lengths = np.frombuffer(idx, np.int32, n_seq, off)
    pointers = np.frombuffer(idx, np.int64, n_seq, off + 4 * n_seq)
    docs = np.frombuffer(idx, np.int64, n_doc, off + 12 * n_seq)
    assert len(idx) == off + 12 * n_seq + 8 * n_doc
    dtype = np.dtype(CODES[code])
    data = Path(f"{prefix}.bin").read_bytes()
    seqs = [np.frombuffer(data, dtype, int(n), int(p))
            for n, p in zip(lengths, pointers, strict=True)]
    return dtype, seqs, docs


def write_megatron(prefix: Path, seqs: list[list[int]], dtype: type, code: int) -> None:
    """A ``.bin``/``.idx`` pair the way Megatron's ``_IndexWriter`` lays it out."""
    arrays = [np.asarray(s, dtype=dtype) for s in seqs]
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])[:-1]]).astype(np.int64)
    docs = np.arange(len(arrays) + 1, dtype=np.int64)
    Path(f"{prefix}.bin").write_bytes(b"".join(a.tobytes() for a in arrays))
    header = MAGIC + struct.pack("<Q", 1) + struct.pack("<B", code) + struct.pack(
        "<Q", len(arrays)) + struct.pack("<Q", len(docs))
    Path(f"{prefix}.idx").write_bytes(header + lengths.tobytes() + pointers[: len(arrays)]
                                      .tobytes() + docs.tobytes())


def chunk_prefixes(root: Path) -> list[Path]:
    return sorted(p.with_suffix("") for p in (root / "chunks").rglob("*.idx"))


@pytest.mark.parametrize("dtype", ["uint16", "int32"])
def test_shardwise_chunks_parse_with_an_independent_reader(tmp_path: Path, dtype: str) -> None:
    docs = sample_docs(11, seed=3, vocab_size=60000)
    root = make_cache(tmp_path / "c", [docs], chunk_docs=4, dtype=dtype, vocab_size=60000)
    got: list[list[int]] = []
    for prefix in chunk_prefixes(root):
        dt, seqs, doc_idx = read_megatron(prefix)
        assert dt == np.dtype(dtype)
        assert doc_idx.tolist() == list(range(len(seqs) + 1))
        got += [s.tolist() for s in seqs]
    assert got == docs


@pytest.mark.parametrize(("dtype", "code"), [(np.uint16, 8), (np.int32, 4), (np.uint8, 1)])
def test_a_megatron_pair_written_by_the_test_opens_with_open_cache(
        tmp_path: Path, dtype: type, code: int) -> None:
    seqs = [[5, 6, 7], [8], [], [1, 2, 3, 4, 200]]
    write_megatron(tmp_path / "corpus_text_document", seqs, dtype, code)
    for name in ("corpus_text_document", "corpus_text_document.bin"):
        cache = shardwise.open_cache(tmp_path / name)
        assert cache.is_megatron and cache.num_documents == 4 and cache.num_tokens == 9
        assert cache.dtype == np.dtype(dtype)
        assert cache.doc_lengths(0).tolist() == [3, 1, 0, 5]
        assert cache.tokens(0).tolist() == [t for s in seqs for t in s]


def _megatron_indexed_dataset() -> type | None:
    """megatron-core's IndexedDataset, or None if megatron-core is not installed.

    Importing it warns that Transformer Engine and Apex are missing; that warning is
    about megatron's optimizer, not about the dataset code under test.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        except ImportError:
            return None
    return IndexedDataset  # type: ignore[no-any-return]


def test_megatron_core_reads_every_document_of_shardwise_chunks(tmp_path: Path) -> None:
    indexed_dataset = _megatron_indexed_dataset()
    if indexed_dataset is None:
        pytest.skip("megatron-core is not installed: pip install --no-deps "
                    "megatron-core==0.16.1 to run this interoperability test")
    docs = sample_docs(40, seed=9)
    root = make_cache(tmp_path / "c", [docs[:25], docs[25:]], chunk_docs=7)
    cache = shardwise.open_cache(root)
    seen = 0
    for i, chunk in enumerate(cache.chunks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = indexed_dataset(str(chunk.base))
        assert len(ds) == chunk.documents
        assert ds.sequence_lengths.tolist() == cache.doc_lengths(i).tolist()
        flat = cache.tokens(i)
        offsets = np.concatenate([[0], np.cumsum(cache.doc_lengths(i))])
        for d in range(len(ds)):
            assert ds[d].tolist() == flat[offsets[d]:offsets[d + 1]].tolist()
            seen += 1
    assert seen == len(docs)


def test_megatron_core_reads_a_converted_prefix(tmp_path: Path) -> None:
    indexed_dataset = _megatron_indexed_dataset()
    if indexed_dataset is None:
        pytest.skip("megatron-core is not installed: pip install --no-deps "
                    "megatron-core==0.16.1 to run this interoperability test")
    from shardwise.writer.convert import to_megatron

    docs = sample_docs(30, seed=4)
    root = make_cache(tmp_path / "c", [docs[:10], docs[10:]], chunk_docs=4)
    to_megatron(root, tmp_path / "m" / "corpus")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = indexed_dataset(str(tmp_path / "m" / "corpus"))
    cache = shardwise.open_cache(root)
    expected = [cache.read_tokens(int(a), int(b)).tolist()
                for a, b in _doc_bounds(cache)]
    assert [ds[i].tolist() for i in range(len(ds))] == expected


def _doc_bounds(cache: shardwise.Cache) -> list[tuple[int, int]]:
    lengths = np.concatenate([cache.doc_lengths(i) for i in range(len(cache.chunks))])
    ends = np.cumsum(lengths)
    return list(zip(ends - lengths, ends, strict=True))
