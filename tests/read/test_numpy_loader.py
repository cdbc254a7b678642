"""The numpy loader (issue 29, item 5a): shardwise's global order, placement and resume
without torch. One implementation with the torch loader: the same batches, and a state
saved by either continues exactly in the other."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.testing import assert_resumes_exactly, assert_same_global_order

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = [d or [1] for d in sample_docs(60, seed=3, vocab_size=500)]
    return make_cache(tmp_path_factory.mktemp("npl") / "cache", [docs], chunk_docs=7,
                      vocab_size=500, eod_id=0)


@pytest.fixture(scope="module")
def ds(cache_dir: Path) -> sw.TokenDataset:
    return sw.TokenDataset(cache_dir, seq_len=16, seed=5)


def _take(dl: sw.Loader | object, n: int) -> list[dict[str, np.ndarray]]:
    out = []
    for batch in dl:  # type: ignore[attr-defined]
        out.append({k: np.asarray(v) for k, v in batch.items()})
        if len(out) == n:
            break
    return out


def test_batches_are_numpy_windows_of_the_global_order(ds: sw.TokenDataset) -> None:
    dl = sw.numpy_loader(ds, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 1))
    first, second = _take(dl, 2)
    assert isinstance(first["input_ids"], np.ndarray) and first["input_ids"].shape == (4, 16)
    assert (first["input_ids"] == ds.get_batch([0, 1, 2, 3])["input_ids"]).all()
    assert (second["labels"] == ds.get_batch([4, 5, 6, 7])["labels"]).all()


def test_each_rank_reads_its_slice(ds: sw.TokenDataset) -> None:
    """Placed by World: rank r of 2 gets positions [s·8 + a·4 + r·2, … + 2) of step s."""
    assert_same_global_order(
        lambda w: sw.numpy_loader(ds, global_batch_size=8, micro_batch_size=2, world=w),
        world_sizes=[1, 2, 4], steps=12)
    r1 = _take(sw.numpy_loader(ds, global_batch_size=8, micro_batch_size=2,
                               world=sw.World(1, 2)), 2)
    assert (r1[0]["input_ids"] == ds.get_batch([2, 3])["input_ids"]).all()
    assert (r1[1]["input_ids"] == ds.get_batch([6, 7])["input_ids"]).all()


def test_resumes_exactly_from_every_step(ds: sw.TokenDataset) -> None:
    assert_resumes_exactly(
        lambda: sw.numpy_loader(ds, global_batch_size=4, micro_batch_size=2,
                                world=sw.World(1, 2)), steps=10)


def test_state_crosses_to_the_torch_loader_and_back(ds: sw.TokenDataset) -> None:
    from shardwise.torch import loader

    def sizes() -> dict[str, object]:
        return {"global_batch_size": 8, "micro_batch_size": 2, "world": sw.World(1, 2)}

    whole = _take(sw.numpy_loader(ds, **sizes()), 8)  # type: ignore[arg-type]
    np_dl = sw.numpy_loader(ds, **sizes())  # type: ignore[arg-type]
    _take(np_dl, 3)
    into_torch = loader(ds, **sizes())  # type: ignore[arg-type]
    into_torch.load_state_dict(np_dl.state_dict())
    got = _take(into_torch, 3)
    assert all((g["input_ids"] == w["input_ids"]).all()
               for g, w in zip(got, whole[3:6], strict=True))
    back = sw.numpy_loader(ds, **sizes())  # type: ignore[arg-type]
    back.load_state_dict(into_torch.state_dict())
    assert np_dl.state_dict()["kind"] == into_torch.state_dict()["kind"]
    got = _take(back, 2)
    assert all((g["labels"] == w["labels"]).all() for g, w in zip(got, whole[6:8], strict=True))


def test_an_iterable_reader_is_refused_naming_what_to_do(cache_dir: Path) -> None:
    stream = sw.StreamDataset(cache_dir, seq_len=16, streams=2, world=sw.World(0, 1))
    with pytest.raises(ConfigError, match="iterable and places itself"):
        sw.numpy_loader(stream, global_batch_size=4, micro_batch_size=2)


def test_works_without_torch(cache_dir: Path) -> None:
    """torch blocked from import: the loader reads, places, saves and resumes."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch raises ImportError
        import numpy as np
        import shardwise as sw
        ds = sw.TokenDataset({str(cache_dir)!r}, seq_len=16, seed=5)
        make = lambda: sw.numpy_loader(ds, global_batch_size=4, micro_batch_size=2,
                                       world=sw.World(1, 2))
        dl, rows = make(), []
        for k, batch in enumerate(dl):
            rows.append(batch["input_ids"])
            if k == 1:
                state = dl.state_dict()
            if k == 3:
                break
        again = make()
        again.load_state_dict(state)
        tail = [b["input_ids"] for _, b in zip(range(2), again)]
        assert all((a == b).all() for a, b in zip(tail, rows[2:])), "resume differs"
        assert (rows[0] == ds.get_batch([2, 3])["input_ids"]).all(), "placement"
        assert sys.modules["torch"] is None
        print("ok", type(rows[0]).__name__, state["consumed"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "ndarray", "8"]


def _ahead_threads() -> int:
    import threading

    return sum(t.name == "shardwise-batches-ahead" for t in threading.enumerate())


def _trained(dl: object, n: int) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``n`` batches with 3 ms of "training" after each, and how many made-ahead threads
    were alive as each was handed over."""
    import time

    out, threads = [], []
    for batch in dl:  # type: ignore[attr-defined]
        out.append({k: np.asarray(v) for k, v in batch.items()})
        threads.append(_ahead_threads())
        if len(out) == n:
            break
        time.sleep(0.003)
    return out, threads


@pytest.mark.parametrize("make", ["numpy", "torch"])
def test_batches_made_ahead_are_the_same_batches_and_the_same_position(
        ds: sw.TokenDataset, make: str) -> None:
    """``batches_ahead``: a thread makes the next micro-batches while the caller trains
    (started once the caller is seen training: 3 batches held 1 ms or more; a loop that
    asks again at once gets its batches made on demand). The batches are the same, only
    those handed over count (a stop mid-way leaves the position where the caller is, and
    the thread ends), and a resume continues exactly."""
    from shardwise.torch import loader as torch_loader

    build = sw.numpy_loader if make == "numpy" else torch_loader
    kw = {"global_batch_size": 8, "micro_batch_size": 4, "world": sw.World(0, 1)}
    plain = build(ds, **kw)
    assert plain.describe()["batches_ahead"] == 0  # a local cache's default
    want = _take(plain, 12)
    ahead = build(ds, batches_ahead=3, **kw)
    assert ahead.describe()["batches_ahead"] == 3
    got, threads = _trained(ahead, 6)  # the thread made up to 3 more than these
    assert threads[:3] == [0, 0, 0] and threads[4:] == [1, 1], threads
    assert ahead.state_dict()["consumed"] == 24 and not _ahead_threads()
    more, threads = _trained(ahead, 6)  # iter() again: at the position, not the thread's
    assert threads[4:] == [1, 1], threads
    for a, b in zip(got + more, want, strict=True):
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    flat = build(ds, batches_ahead=3, **kw)
    for k, _ in enumerate(flat):  # asks again at once: no thread
        assert _ahead_threads() == 0
        if k == 12:
            break
    again = build(ds, batches_ahead=2, **kw)
    again.load_state_dict(ahead.state_dict())
    nxt, _ = _trained(again, 1)
    assert (nxt[0]["input_ids"] == ds.get_batch(list(range(48, 52)))["input_ids"]).all()
    assert_resumes_exactly(lambda: build(ds, batches_ahead=2, **kw), steps=6)


def test_an_error_made_ahead_is_raised_when_its_batch_is_asked(ds: sw.TokenDataset) -> None:
    """A batch that fails on the thread fails the loop at that batch, not before: the
    ones before it are handed over and counted."""
    import time

    class Failing(sw.TokenDataset):
        def get_batch(self, indices):  # type: ignore[no-untyped-def]
            if 32 in list(indices):
                raise sw.ShardwiseError("the ninth micro-batch cannot be read")
            return super().get_batch(indices)

    bad = Failing(ds.cache, seq_len=16, seed=5)
    dl = sw.numpy_loader(bad, global_batch_size=4, micro_batch_size=4,
                         world=sw.World(0, 1), batches_ahead=4)
    seen, threads = 0, []
    with pytest.raises(sw.ShardwiseError, match="ninth micro-batch"):
        for _ in dl:
            seen += 1
            threads.append(_ahead_threads())
            time.sleep(0.003)
    assert 1 in threads  # it was made on the thread (which ended with its error)
    assert seen == 8 and dl.state_dict()["consumed"] == 32 and not _ahead_threads()
    with pytest.raises(ConfigError, match="batches_ahead=2 is for num_workers=0"):
        from shardwise.torch import loader as torch_loader

        torch_loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
                     num_workers=1, batches_ahead=2)
