"""shardwise.megatron against megatron-core 0.16.1's own code: data_path / split parsing,
split document ranges, packing and tokens of GPTDataset, masks, ramp-up arithmetic, the
loader's samplers, and Megatron prefixes whose documents hold several sequences."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.megatron import (
    build_pretraining_data_loader,
    build_train_valid_test_datasets,
    get_blend_from_list,
    global_batch_size_at,
    ltor_masks_and_position_ids,
    parse_split,
    split_ranges,
)
from shardwise.storage.cache_range import DocumentRange
from shardwise.writer.convert import to_megatron

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

EOD, VOCAB, L = 0, 500, 16

with warnings.catch_warnings():  # megatron warns about apex / transformer engine
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )
    from megatron.core.datasets.gpt_dataset import (
        GPTDataset,
        GPTDatasetConfig,
        _get_ltor_masks_and_position_ids,
    )
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import get_blend_from_list as mc_get_blend_from_list
    from megatron.core.num_microbatches_calculator import (
        RampupBatchsizeNumMicroBatchesCalculator,
    )
    logging.disable(logging.NOTSET)


class StubTokenizer:  # what GPTDataset reads of a tokenizer
    eod, pad, vocab_size = EOD, VOCAB + 1, VOCAB
    unique_identifiers = {"class": "StubTokenizer", "eod": EOD, "pad": VOCAB + 1}


def docs_with_eod(n: int, seed: int) -> list[list[int]]:
    return [d + [EOD] for d in sample_docs(n, seed=seed, vocab_size=VOCAB, max_len=40)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 documents in chunks of 4: many windows cross a chunk edge."""
    root = tmp_path_factory.mktemp("mg") / "cache"
    return make_cache(root, [docs_with_eod(60, seed=5)], chunk_docs=4, vocab_size=VOCAB,
                      eod_id=EOD)


@pytest.fixture(scope="module")
def prefix(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mg-prefix") / "corpus_text_document"
    to_megatron(cache_dir, out)
    return out


def megatron_splits(prefix: Path, split: str, tmp: Path, **flags: Any) -> list[Any]:
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=L, blend=([str(prefix)], None), split=split,
        tokenizer=StubTokenizer(), reset_position_ids=flags.get("reset", False),
        reset_attention_mask=flags.get("reset", False), eod_mask_loss=False,
        create_attention_mask=False, path_to_cache=str(tmp), mmap_bin_files=True)
    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True,
                                         config).build()


# -- data_path and split ------------------------------------------------------------------
@pytest.mark.parametrize("blend", [["0.3", "A", "0.7", "B"], ["A", "B", "C"], ["A"],
                                   ["30", "A", "70", "B"], ["A", "B"], ["1", "A"]])
def test_data_path_lists_parse_as_megatron_parses_them(blend: list[str]) -> None:
    assert get_blend_from_list(blend) == tuple(mc_get_blend_from_list(blend))
    assert get_blend_from_list(" ".join(blend)) == tuple(mc_get_blend_from_list(blend))


@pytest.mark.parametrize("split", ["969,30,1", "99,1,0", "1", "8,2", "0.7, 0.2, 0.1",
                                   "1,1,1"])
@pytest.mark.parametrize("n", [1, 7, 60, 1001])
def test_split_strings_cut_documents_as_megatron_does(split: str, n: int) -> None:
    assert parse_split(split) == parse_and_normalize_split(split)
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    want = [None if m is None else (int(round(m[0] * float(n))), int(round(m[1] * float(n))))
            for m in matrix]
    assert split_ranges(n, split) == want


def test_bad_split_and_data_path_are_named() -> None:
    with pytest.raises(ConfigError, match="split"):
        parse_split("0,0,0")
    with pytest.raises(ConfigError, match="data_path"):
        get_blend_from_list("")


# -- documents and tokens against GPTDataset -------------------------------------------------
def test_splits_hold_megatrons_documents_and_windows(cache_dir: Path, prefix: Path,
                                                     tmp_path: Path) -> None:
    """Per split: Megatron's document indices are shardwise's document range; the split's
    tokens are those documents'; Megatron's samples are windows of L + 1 cut from its
    shuffled documents, the rule shardwise packs by; as many samples as shardwise's."""
    mc = megatron_splits(prefix, "6,3,1", tmp_path)
    ours = build_train_valid_test_datasets(str(cache_dir), split="6,3,1", seq_length=L,
                                           create_attention_mask=False)
    cache = sw.open_cache(cache_dir)
    starts = np.concatenate([[0], np.cumsum(np.concatenate(
        [cache.doc_lengths(c) for c in range(len(cache.chunks))]))])
    for k, (m, s) in enumerate(zip(mc, ours, strict=True)):
        beg, end = split_ranges(cache.num_documents, "6,3,1")[k]
        assert m.indices.tolist() == list(range(beg, end))
        assert len(s) == len(m)
        part = DocumentRange(cache, beg, end)
        assert (part.read_tokens(0, part.num_tokens)
                == cache.read_tokens(int(starts[beg]), int(starts[end]))).all()
        # Megatron's own document order, packed by the window rule, gives its samples
        stream = np.concatenate([cache.read_tokens(int(starts[d]), int(starts[d + 1]))
                                 for d in m.document_index]).astype(np.int64)
        for i in range(len(m)):
            w = int(m.shuffle_index[i])
            got = m[i]
            want = stream[w * L: w * L + L + 1]
            assert (got["tokens"].numpy() == want[:L]).all()
            assert (got["labels"].numpy() == want[1:]).all()


def test_a_shuffled_epoch_covers_every_token_of_the_split_once(cache_dir: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(str(cache_dir), split="6,3,1",
                                                  seq_length=L, create_attention_mask=False)
    assert train is not None
    rows = train.__getitems__(list(range(len(train))))
    cache = sw.open_cache(cache_dir)
    beg, end = split_ranges(cache.num_documents, "6,3,1")[0]
    part = DocumentRange(cache, beg, end)
    everything = np.sort(part.read_tokens(0, part.num_tokens).astype(np.int64))
    seen = np.sort(rows["tokens"].reshape(-1))
    tail = part.num_tokens - len(train) * L  # the last partial window, dropped by design
    assert 0 < tail <= L
    assert np.isin(seen, everything).all() and len(seen) == part.num_tokens - tail


def test_windows_across_chunk_edges_are_not_lost(cache_dir: Path, tmp_path: Path) -> None:
    """Megatron's builder over the chunk prefixes packs each chunk alone; shardwise packs
    across chunk edges, as Megatron does over one merged prefix."""
    cache = sw.open_cache(cache_dir)
    per_chunk = sum((c.tokens - 1) // L for c in cache.chunks)
    (ours,) = [d for d in build_train_valid_test_datasets(
        str(cache_dir), split="1", seq_length=L, create_attention_mask=False) if d]
    assert len(ours) == (cache.num_tokens - 1) // L > per_chunk


# -- Megatron prefixes whose documents hold several sequences ---------------------------------
def test_a_megatron_document_of_several_sequences_stays_one_document(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    prefix = str(tmp_path / "sentences_text_sentence")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    docs = []
    for _ in range(12):
        sents = [rng.integers(1, VOCAB, size=int(rng.integers(1, 9))).tolist()
                 for _ in range(int(rng.integers(1, 5)))]
        sents[-1].append(EOD)
        for s in sents:
            builder.add_item(torch.tensor(s))
        builder.end_document()
        docs.append(sum(sents, []))
    builder.finalize(prefix + ".idx")
    mc = IndexedDataset(prefix, multimodal=False, mmap=True)
    cache = sw.open_cache(prefix)
    assert cache.num_documents == len(mc.document_indices) - 1 == 12
    assert len(mc.sequence_lengths) > 12
    assert cache.doc_lengths(0).tolist() == [len(d) for d in docs]
    ds = sw.TokenDataset(cache, seq_len=4, shuffle="document", seed=3)
    got = ds.__getitems__(list(range(len(ds))))
    # the shuffled stream the windows were cut from (consecutive windows share one token)
    stream = np.concatenate([got["input_ids"].reshape(-1), got["labels"][-1, -1:]]).tolist()
    covered = 0
    for d in docs:  # every document is one run of the stream: its sentences stay together
        runs = [i for i in range(len(stream) - len(d) + 1) if stream[i:i + len(d)] == d]
        covered += len(d) if runs else 0
    assert covered >= len(stream) - max(len(d) for d in docs)


# -- masks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("reset_pos", [False, True])
@pytest.mark.parametrize("reset_attn", [False, True])
@pytest.mark.parametrize("eod_mask", [False, True])
@pytest.mark.parametrize("create", [False, True])
def test_masks_and_positions_match_megatron(reset_pos: bool, reset_attn: bool,
                                            eod_mask: bool, create: bool) -> None:
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 6, size=(5, 24))  # id 0 is the eod: several per row
    tokens[0, -1] = EOD
    tokens[1, 0] = EOD
    attn, loss, pos = ltor_masks_and_position_ids(
        tokens, EOD, reset_position_ids=reset_pos, reset_attention_mask=reset_attn,
        eod_mask_loss=eod_mask, create_attention_mask=create)
    for r in range(len(tokens)):
        m_attn, m_loss, m_pos = _get_ltor_masks_and_position_ids(
            torch.from_numpy(tokens[r]), EOD, reset_pos, reset_attn, eod_mask, create)
        assert (loss[r] == m_loss.numpy()).all() and (pos[r] == m_pos.numpy()).all()
        if create:
            assert attn is not None and (attn[r] == m_attn.numpy()).all()
        else:
            assert attn is None and m_attn is None


def test_samples_carry_megatrons_keys_and_masks(cache_dir: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(
        str(cache_dir), split="1", seq_length=L, reset_position_ids=True,
        reset_attention_mask=True, eod_mask_loss=True)
    assert train is not None
    b = train.__getitems__([0, 3, -1])  # -1: a padding row (evaluation)
    assert set(b) == {"tokens", "labels", "loss_mask", "position_ids", "attention_mask"}
    assert b["attention_mask"].shape == (3, 1, L, L) and b["attention_mask"].dtype == bool
    for r in range(2):
        m_attn, m_loss, m_pos = _get_ltor_masks_and_position_ids(
            torch.from_numpy(b["tokens"][r]), EOD, True, True, True, True)
        assert (b["loss_mask"][r] == m_loss.numpy()).all()
        assert (b["position_ids"][r] == m_pos.numpy()).all()
        assert (b["attention_mask"][r] == m_attn.numpy()).all()
    assert (b["loss_mask"][2] == 0).all() and (b["labels"] >= 0).all()


def test_resets_without_an_eod_id_are_refused(prefix: Path) -> None:
    with pytest.raises(ConfigError, match="eod_token"):
        build_train_valid_test_datasets(str(prefix), split="1", seq_length=L,
                                        eod_mask_loss=True)
    (ds, _, _) = build_train_valid_test_datasets(str(prefix), split="1", seq_length=L,
                                                 eod_mask_loss=True, eod_token=EOD)
    assert ds is not None and ds.eod_token == EOD


# -- blends ---------------------------------------------------------------------------------
def test_a_weighted_data_path_blends_by_weight(cache_dir: Path, prefix: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(
        f"0.25 {cache_dir} 0.75 {prefix}", split="1", seq_length=L,
        create_attention_mask=False)
    assert train is not None
    counts = train.dataset.counts_at(400)
    assert counts.tolist() == [100, 300]


# -- ramp-up and loaders ------------------------------------------------------------------
@pytest.mark.parametrize(("rampup", "gbs"), [((16, 16, 4800), 64), ((8, 8, 1000), 32),
                                             ((4, 4, 100), 16)])
def test_rampup_arithmetic_matches_megatrons_calculator(rampup: tuple[int, int, int],
                                                        gbs: int) -> None:
    calc = RampupBatchsizeNumMicroBatchesCalculator(gbs, 4, 1, False, 1, *rampup)
    for consumed in [0, 1, 599, 600, 1599, 1600, 2000, 3200, 4799, 4800, 4801, 10**6]:
        calc.update(consumed, consistency_check=False)
        assert global_batch_size_at(consumed, gbs, rampup) == calc.get_current_global_batch_size()
    assert global_batch_size_at(0, gbs, (rampup[0], rampup[1], 0)) == gbs  # no ramp at all


def _rows(loader: Any, steps: int) -> list[list[int]]:
    it = iter(loader)
    return [next(it)["tokens"][:, 0].tolist() for _ in range(steps)]


@pytest.mark.parametrize("kind", ["single", "cyclic"])
def test_the_loader_resumes_from_consumed_samples(cache_dir: Path, kind: str) -> None:
    train, _, _ = build_train_valid_test_datasets(str(cache_dir), split="1", seq_length=L,
                                                  create_attention_mask=False)
    for rank in range(2):
        world = sw.World(rank, 2)
        full = _rows(build_pretraining_data_loader(train, 0, micro_batch_size=2, world=world,
                                                   dataloader_type=kind, seed=9), 12)
        tail = _rows(build_pretraining_data_loader(train, 7 * 4, micro_batch_size=2,
                                                   world=world, dataloader_type=kind, seed=9),
                     5)
        assert tail == full[7:]


def test_single_reads_the_datasets_order_split_between_ranks(cache_dir: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(str(cache_dir), split="1", seq_length=L,
                                                  create_attention_mask=False)
    assert train is not None
    r0, r1 = (build_pretraining_data_loader(train, 0, micro_batch_size=2,
                                            world=sw.World(r, 2)) for r in range(2))
    b0, b1 = next(iter(r0)), next(iter(r1))
    want = train.__getitems__([0, 1, 2, 3])["tokens"]
    assert (torch.cat([b0["tokens"], b1["tokens"]]).numpy() == want).all()


def test_external_passes_a_loader_through_and_refuses_a_map_style_dataset(
        cache_dir: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(str(cache_dir), split="1", seq_length=L)
    with pytest.raises(ConfigError, match="map-style"):
        build_pretraining_data_loader(train, 0, micro_batch_size=2, world=sw.World(0, 2),
                                      dataloader_type="external")
    stream = sw.StreamDataset(cache_dir, seq_len=L, streams=2, world=sw.World(0, 2))
    assert build_pretraining_data_loader(stream, 0, micro_batch_size=2,
                                         dataloader_type="external") is stream
    with pytest.raises(ConfigError, match=r"skip_steps=\[\(1, 2\)\] with dataloader_type="
                                          r"'external': give the StreamDataset skip="):
        build_pretraining_data_loader(stream, 0, micro_batch_size=2, skip_steps=[(1, 2)],
                                      dataloader_type="external")
    with pytest.raises(ConfigError, match="dataloader_type"):
        build_pretraining_data_loader(train, 0, micro_batch_size=2, dataloader_type="x")


# -- a shardwise cache handed to Megatron's own builder -----------------------------------
@pytest.fixture
def one_rank_group(tmp_path: Path) -> Any:
    """Megatron's BlendedDataset asks torch.distributed for the rank: a 1-rank gloo group."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store",
                                         rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def _builder(blend: Any, sizes: list[Any], tmp: Path) -> list[Any]:
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=L, blend=blend, split="1,0,0",
        tokenizer=StubTokenizer(), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=str(tmp),
        mmap_bin_files=True)
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def test_the_chunk_prefix_list_builds_in_megatron_and_counts_what_it_loses(
        cache_dir: Path, tmp_path: Path, one_rank_group: Any) -> None:
    from shardwise.writer.convert import megatron_data_path

    d = megatron_data_path(cache_dir, seq_len=L)
    cache = sw.open_cache(cache_dir)
    assert d.chunks == len(cache.chunks) and d.windows == (cache.num_tokens - 1) // L
    prefixes, weights = mc_get_blend_from_list(d.items)
    assert weights == [float(c.tokens) for c in cache.chunks]
    # unweighted: one epoch of every chunk, packed chunk by chunk
    (whole, _, _) = _builder((prefixes, None), [None, None, None], tmp_path / "a")
    assert len(whole) == d.windows_per_chunk and d.lost_windows == d.windows - len(whole) > 0
    # weighted by tokens (what the list says): every sample lies inside one chunk
    (mixed, _, _) = _builder((prefixes, weights), [64, 0, 0], tmp_path / "b")
    chunks = [cache.tokens(c).astype(np.int64).tolist() for c in range(len(cache.chunks))]
    for i in range(64):
        s = mixed[i]
        row = [*s["tokens"].tolist(), int(s["labels"][-1])]
        assert any(any(ch[j:j + L + 1] == row for j in range(len(ch) - L)) for ch in chunks)


# -- a split is a run of documents ---------------------------------------------------------
def test_a_document_range_reads_only_its_chunks_and_windows_cross_their_edges(
        cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    part = DocumentRange(cache, 6, 30)  # cuts chunk 1 (docs 4-7) and chunk 7 (docs 28-31)
    starts = np.concatenate([[0], np.cumsum(np.concatenate(
        [cache.doc_lengths(c) for c in range(len(cache.chunks))]))])
    assert part.num_documents == 24 and part.num_tokens == starts[30] - starts[6]
    ds = sw.TokenDataset(part, seq_len=L, shuffle="none")
    rows = ds.__getitems__(list(range(len(ds))))
    stream = cache.read_tokens(int(starts[6]), int(starts[30])).astype(np.int64)
    for w in range(len(ds)):
        assert (rows["input_ids"][w] == stream[w * L: w * L + L]).all()
    assert len(ds) == (part.num_tokens - 1) // L
    assert set(cache.opened) == {cache.chunks[c].stem for c in range(1, 8)}
    with pytest.raises(ConfigError, match="start <= stop"):
        DocumentRange(cache, 5, cache.num_documents + 1)


def test_worker_processes_serve_the_same_samples(cache_dir: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(str(cache_dir), split="1", seq_length=L,
                                                  reset_position_ids=True)
    kw: dict[str, Any] = {"micro_batch_size": 2, "world": sw.World(1, 2)}
    inline = build_pretraining_data_loader(train, 8, **kw)
    workers = build_pretraining_data_loader(train, 8, num_workers=2, **kw)
    for a, b in zip(_take(inline, 4), _take(workers, 4), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _take(loader: Any, n: int) -> list[Any]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_full_validation_is_one_padded_pass(cache_dir: Path) -> None:
    """Megatron's --full-validation: one pass, every window once, the last step padded
    with masked rows (an eval split built with drop_last is refused: it drops a window)."""
    _, valid, _ = build_train_valid_test_datasets(str(cache_dir), split="6,3,1", seq_length=L)
    assert valid is not None
    with pytest.raises(ConfigError, match="drop"):
        build_pretraining_data_loader(valid, 0, micro_batch_size=2, world=sw.World(0, 2),
                                      full_validation=True)
    _, valid, _ = build_train_valid_test_datasets(
        str(cache_dir), split="6,3,1", seq_length=L,
        drop_last_partial_validation_sequence=False)
    assert valid is not None
    rows = []
    for rank in range(2):
        dl = build_pretraining_data_loader(valid, 123, micro_batch_size=2,
                                           world=sw.World(rank, 2), full_validation=True)
        rows.append([b for b in dl])
    got = [b for step in zip(*rows, strict=True) for b in step]
    tokens = torch.cat([b["tokens"] for b in got]).numpy()
    mask = torch.cat([b["loss_mask"] for b in got]).numpy()
    n = len(valid)
    assert (tokens[:n] == valid.__getitems__(list(range(n)))["tokens"]).all()
    assert len(tokens) == -(-n // 4) * 4 and (mask[n:] == 0).all() and mask[n - 1].sum() < L


def test_no_target_labels_become_token_zero_with_no_loss() -> None:
    """shardwise's native labels mark "no target" with -100 (loss_mask 0); Megatron's loss
    indexes the vocabulary with every label, so they become 0, still masked."""
    from shardwise.megatron import GPTDataset as SwGPTDataset

    class Inner:
        def __len__(self) -> int:
            return 1

        def __getitems__(self, indices: list[int]) -> dict[str, np.ndarray]:
            return {"input_ids": np.array([[5, 6, 7, 8]]),
                    "labels": np.array([[6, 7, -100, -100]]),
                    "loss_mask": np.array([[1, 1, 0, 0]], dtype=np.float32),
                    "position_ids": np.arange(4)[None]}

    b = SwGPTDataset(Inner(), create_attention_mask=False).__getitems__([0])
    assert b["labels"].tolist() == [[6, 7, 0, 0]]
    assert b["loss_mask"].tolist() == [[1, 1, 0, 0]]
