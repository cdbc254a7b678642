"""Global placement across real processes: 1, 2 and 4 ranks (gloo on CPU), each reading
with ``shardwise.torch.loader`` and ``World.detect()``.

The ranks only record what they received; every check happens here, against the dataset
in this process and against windows identified by their tokens (``WindowIndex``), so a
wrong placement, a skipped or repeated window, an inexact resume or a stray chunk read
fails a test. All runs happen once per module (two stages: W=2, then W=4 and W=1, which
resume the state W=2 saved).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.distributed.harness import SEED, SEQ_LEN, Outcome, WindowIndex, finish, launch

import shardwise as sw
from shardwise.errors import StateError
from shardwise.torch import loader

B = 16  # global batch
M = 2  # micro-batch
EXAMPLES = 4096  # read by the reference run of every world size: an epoch (3068) and more
TAIL_EXAMPLES = 256  # read after each resume
DEEP = [0, 10_000 * B, 10**9 * B]  # seek points (the last is ~5 million epochs deep)
DEEP_SECONDS = 5.0
DOC_STEPS = 4  # micro-batches read with the document shuffle
WORKERS_2 = {"num_workers": 2, "persistent_workers": True, "pin_memory": True}


def _loader_opts(**extra: Any) -> dict[str, Any]:
    return {"global_batch_size": B, "micro_batch_size": M, **extra}


@dataclass
class Runs:
    root: Path
    by_world: dict[int, Outcome]
    saved_state: Path
    resume_points: dict[str, tuple[int, int]]  # task -> (world size, stop micro-step)


def _plan_dir(root: Path, w: int) -> Path:
    return root / f"plans-w{w}"


def _common_tasks(root: Path, cache: str, w: int) -> list[dict[str, Any]]:
    tasks = [
        {"name": "order", "kind": "run", "cache": cache, "dataset": {"seq_len": SEQ_LEN,
         "seed": SEED}, "loader": _loader_opts(num_workers=0), "steps": EXAMPLES // (M * w)},
        {"name": "local", "kind": "run", "cache": cache, "dataset": {"seq_len": SEQ_LEN,
         "seed": SEED}, "loader": _loader_opts(num_workers=0), "steps": 8},
        {"name": "seek", "kind": "seek", "cache": cache, "dataset": {"seq_len": SEQ_LEN,
         "seed": SEED}, "loader": _loader_opts(num_workers=0), "consumed": DEEP},
    ]
    if w > 1:  # document shuffle with its plan not built yet: the ranks race to build it
        doc = {"seq_len": SEQ_LEN, "seed": SEED, "shuffle": "document",
               "plan_dir": str(_plan_dir(root, w))}
        tasks.append({"name": "docshuffle", "kind": "run", "cache": cache, "dataset": doc,
                      "loader": _loader_opts(num_workers=0), "steps": DOC_STEPS})
    return tasks


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_chunk_cache: Path) -> Runs:
    root = tmp_path_factory.mktemp("runs")
    cache = str(small_chunk_cache)
    ds_opts = {"seq_len": SEQ_LEN, "seed": SEED}
    rng = random.Random(20240611)
    saved = root / "state-w2.json"
    # W=2: any micro-step for a same-size resume; a global-batch boundary (4 micro-steps)
    # shortly before the end of epoch 0 for the state the other sizes resume
    stop_any = rng.randrange(1, 700)
    stop_boundary = 4 * rng.randrange(176, 192)
    stop_w4 = rng.randrange(1, 400)
    w2 = _common_tasks(root, cache, 2) + [
        {"name": "resume_w0", "kind": "resume", "cache": cache, "dataset": ds_opts,
         "stop": stop_any, "tail": TAIL_EXAMPLES // (M * 2),
         "first": _loader_opts(num_workers=0), "second": _loader_opts(**WORKERS_2)},
        {"name": "resume_w2", "kind": "resume", "cache": cache, "dataset": ds_opts,
         "stop": stop_boundary, "tail": TAIL_EXAMPLES // (M * 2),
         "first": _loader_opts(**WORKERS_2, prefetch_factor=4),
         "second": _loader_opts(num_workers=0), "save_to": str(saved)},
        {"name": "eval", "kind": "eval", "cache": cache,
         "dataset": {**ds_opts, "shuffle": "none", "drop_last": False},
         "loader": {"global_batch_size": M * 2, "micro_batch_size": M, "sampler": "eval"}},
    ]
    (two,) = finish(launch(root, "w2", 2, w2))  # W=4 and W=1 resume the state it saved

    def cross(w: int, opts: dict[str, Any]) -> dict[str, Any]:
        return {"name": "cross", "kind": "run", "cache": cache, "dataset": ds_opts,
                "loader": _loader_opts(**opts), "state_in": str(saved),
                "steps": TAIL_EXAMPLES // (M * w)}

    w4 = _common_tasks(root, cache, 4) + [cross(4, WORKERS_2), {
        "name": "resume_w4", "kind": "resume", "cache": cache, "dataset": ds_opts,
        "stop": stop_w4, "tail": TAIL_EXAMPLES // (M * 4), "first": _loader_opts(num_workers=0),
        "second": _loader_opts(num_workers=2)}]
    w1 = _common_tasks(root, cache, 1) + [cross(1, {"num_workers": 0})]
    four, one = finish(launch(root, "w4", 4, w4), launch(root, "w1", 1, w1))
    return Runs(root, {1: one, 2: two, 4: four}, saved,
                {"resume_w0": (2, stop_any), "resume_w2": (2, stop_boundary),
                 "resume_w4": (4, stop_w4)})


@pytest.fixture(scope="module")
def ds(small_chunk_cache: Path) -> sw.TokenDataset:
    return sw.TokenDataset(small_chunk_cache, seq_len=SEQ_LEN, seed=SEED)


@pytest.fixture(scope="module")
def windex(small_chunk_cache: Path) -> WindowIndex:
    return WindowIndex(small_chunk_cache, SEQ_LEN)


def _windows(out: Outcome, task: str, part: str, windex: WindowIndex) -> list[np.ndarray]:
    """Each rank's windows of ``part``, shaped (steps, micro_batch)."""
    ids = out.per_rank(task, part, "input_ids")
    labels = out.per_rank(task, part, "labels")
    return [windex.of(i.reshape(-1, SEQ_LEN), lab.reshape(-1, SEQ_LEN)).reshape(i.shape[:2])
            for i, lab in zip(ids, labels, strict=True)]


def _global_windows(out: Outcome, task: str, part: str, windex: WindowIndex) -> np.ndarray:
    return windex.of(out.global_rows(task, part, "input_ids"),
                     out.global_rows(task, part, "labels"))


# -- 1. determinism and placement ----------------------------------------------------------------
def test_world_sizes_1_2_4_produce_the_same_global_batches(runs: Runs, ds: sw.TokenDataset
                                                           ) -> None:
    expected = ds.__getitems__(np.arange(EXAMPLES))
    for key in ("input_ids", "labels", "loss_mask"):
        for w, out in runs.by_world.items():
            assert out.steps("order", "run") == [EXAMPLES // (M * w)] * w
            got = out.global_rows("order", "run", key)
            assert got.shape == expected[key].shape, (w, key)
            bad = np.flatnonzero((got != expected[key]).any(axis=1))
            assert bad.size == 0, f"W={w}: {key} differs from the global order at rows {bad[:5]}"


def test_ranks_split_each_global_batch_disjointly_and_completely(
        runs: Runs, ds: sw.TokenDataset, windex: WindowIndex) -> None:
    for w, out in runs.by_world.items():
        per_rank = _windows(out, "order", "run", windex)
        accumulation = B // (M * w)
        for b in range(EXAMPLES // B):
            steps = slice(b * accumulation, (b + 1) * accumulation)
            shares = [set(r[steps].ravel().tolist()) for r in per_rank]
            taken = np.concatenate([r[steps].ravel() for r in per_rank])
            assert len(taken) == B and len(set(taken.tolist())) == B, (
                f"W={w}, global batch {b}: ranks' examples overlap: {sorted(taken)}")
            assert set().union(*shares) == set(ds.windows(np.arange(b * B, (b + 1) * B))
                                               .tolist()), f"W={w}, global batch {b}"


def test_an_epoch_reads_every_window_exactly_once(runs: Runs, ds: sw.TokenDataset,
                                                  windex: WindowIndex) -> None:
    n = len(ds)
    assert n < EXAMPLES < 2 * n
    for w, out in runs.by_world.items():
        seen = _global_windows(out, "order", "run", windex)
        epoch0, epoch1 = seen[:n], seen[n:]
        assert np.array_equal(np.sort(epoch0), np.arange(n)), f"W={w}: epoch 0 is not a bijection"
        assert len(set(epoch1.tolist())) == len(epoch1), f"W={w}: epoch 1 repeats a window"
        assert np.array_equal(seen, ds.windows(np.arange(EXAMPLES))), f"W={w}"
        assert not np.array_equal(epoch0, np.arange(n)), "epoch 0 is not shuffled"
        assert not np.array_equal(epoch1, epoch0[: len(epoch1)]), "epochs share one order"


# -- 2. exact resume -------------------------------------------------------------------------------
def _reference(runs: Runs) -> np.ndarray:
    return runs.by_world[1].global_rows("order", "run")


@pytest.mark.parametrize("task", ["resume_w0", "resume_w2", "resume_w4"])
def test_resume_same_world_size_continues_exactly(runs: Runs, task: str) -> None:
    w, stop = runs.resume_points[task]
    out = runs.by_world[w]
    ref = _reference(runs)
    consumed = stop * M * w
    state = json.loads(out.states(task)[0])
    assert state["consumed"] == consumed, "the state must count received, not prefetched"
    assert np.array_equal(out.global_rows(task, "head"), ref[:consumed])
    tail = ref[consumed: consumed + TAIL_EXAMPLES]
    for part in ("again", "rewound", "resumed"):
        got = out.global_rows(task, part)
        assert got.shape == tail.shape, (task, part)
        bad = np.flatnonzero((got != tail).any(axis=1))
        assert bad.size == 0, f"{task}/{part}: differs at example {consumed + bad[0]}"
    after = consumed + TAIL_EXAMPLES
    for key in ("state_after_again", "state_after_resumed"):
        assert json.loads(out.ranks(task)[0].info[key])["consumed"] == after, key


def test_resume_at_w2_boundary_crosses_an_epoch(runs: Runs, ds: sw.TokenDataset) -> None:
    """The cross-size resume point is chosen so the continuation runs into epoch 1."""
    consumed = json.loads(runs.saved_state.read_text())["consumed"]
    assert consumed % B == 0 and consumed < len(ds) < consumed + TAIL_EXAMPLES


@pytest.mark.parametrize("w", [4, 1])
def test_resume_under_another_world_size_continues_exactly(runs: Runs, w: int) -> None:
    consumed = json.loads(runs.saved_state.read_text())["consumed"]
    got = runs.by_world[w].global_rows("cross", "run")
    want = _reference(runs)[consumed: consumed + TAIL_EXAMPLES]
    assert got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"W=2 state resumed at W={w} differs at example {consumed + bad[0]}"


def test_saved_state_is_identical_on_every_rank_and_world_size(runs: Runs) -> None:
    for w, out in runs.by_world.items():
        for task in out.tasks:
            if task in ("eval", "seek"):
                continue
            states = out.states(task)
            assert len(states) == w and len(set(states)) == 1, (
                f"W={w} {task}: ranks saved different states:\n" + "\n".join(states))
    saved = json.loads(runs.saved_state.read_text())
    assert saved == json.loads(runs.by_world[2].states("resume_w2")[1])
    # the same global position saves the same state, whatever the world size
    ends = {runs.by_world[4].states("cross")[0], runs.by_world[1].states("cross")[0],
            runs.by_world[2].ranks("resume_w2")[0].info["state_after_resumed"]}
    assert len(ends) == 1, ends
    assert json.loads(ends.pop())["consumed"] == saved["consumed"] + TAIL_EXAMPLES


# -- 3. foreign states are refused -----------------------------------------------------------------
@pytest.mark.parametrize("change, field", [
    ({"seed": 99}, "seed"),
    ({"seq_len": 64}, "seq_len"),
    ({"cache": "reordered"}, "cache"),
])
def test_a_state_of_other_data_or_config_is_refused_naming_the_field(
        runs: Runs, small_chunk_cache: Path, reordered_cache: Path, change: dict[str, Any],
        field: str) -> None:
    state = json.loads(runs.saved_state.read_text())
    opts = {"seq_len": SEQ_LEN, "seed": SEED, **change}
    cache = reordered_cache if opts.pop("cache", None) else small_chunk_cache
    other = sw.TokenDataset(cache, **opts)
    dl = loader(other, global_batch_size=B, micro_batch_size=M, world=sw.World(0, 2))
    with pytest.raises(StateError, match=rf"(?m)^\s+{field}: state has "):
        dl.load_state_dict(state)
    assert dl.consumed == 0, "a refused state must not move the loader"
    same = loader(sw.TokenDataset(small_chunk_cache, seq_len=SEQ_LEN, seed=SEED),
                  global_batch_size=B, micro_batch_size=M, world=sw.World(0, 2))
    same.load_state_dict(state)
    assert same.consumed == state["consumed"]


# -- 4. locality ---------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["local", "order"])
def test_each_rank_opens_only_the_chunks_of_its_examples(runs: Runs, windex: WindowIndex,
                                                         task: str) -> None:
    for w, out in runs.by_world.items():
        for r, (result, windows) in enumerate(zip(out.ranks(task),
                                                  _windows(out, task, "run", windex),
                                                  strict=True)):
            opened = set(result.info["opened"])
            expected = windex.chunk_stems(windows.ravel())
            assert opened <= expected, (f"W={w} rank {r} opened chunks holding none of its "
                                        f"examples: {sorted(opened - expected)}")
            assert opened == expected, f"W={w} rank {r} did not read {expected - opened}"
            if task == "local" and w == 4:
                assert len(windex.all_stems) > 60
                assert opened != windex.all_stems, f"rank {r} of 4 opened every chunk"


@pytest.mark.parametrize("w", [2, 4])
def test_document_shuffle_ranks_agree_and_open_only_their_chunks(
        runs: Runs, small_chunk_cache: Path, windex: WindowIndex, w: int) -> None:
    """The document shuffle's plan is built by racing ranks; each must still give the one
    global order and open only the chunks of its own examples."""
    out = runs.by_world[w]
    plan = _plan_dir(runs.root, w)

    def warm() -> sw.TokenDataset:  # the plan is on disk now
        return sw.TokenDataset(small_chunk_cache, seq_len=SEQ_LEN, seed=SEED,
                               shuffle="document", plan_dir=plan)

    step = M * w
    want = warm().__getitems__(np.arange(DOC_STEPS * step))
    assert np.array_equal(out.global_rows("docshuffle", "run"), want["input_ids"])
    for r, result in enumerate(out.ranks("docshuffle")):
        mine = [k * step + r * M + j for k in range(DOC_STEPS) for j in range(M)]
        reference = warm()
        reference.__getitems__(mine)
        expected = set(reference.cache.opened)
        opened = set(result.info["opened"])
        assert opened <= expected, (
            f"W={w} rank {r} opened {len(opened)} of {len(windex.all_stems)} chunks for "
            f"{len(mine)} examples that live in {len(expected)}: "
            f"{sorted(opened - expected)[:4]}…")


# -- 5. seeking -----------------------------------------------------------------------------------
def test_seeking_deep_opens_only_the_chunks_of_that_batch(runs: Runs, ds: sw.TokenDataset,
                                                          windex: WindowIndex) -> None:
    for w, out in runs.by_world.items():
        per_point = [r.info["points"] for r in out.ranks("seek")]
        for i, consumed in enumerate(DEEP):
            want = ds.__getitems__(np.arange(consumed, consumed + M * w))["input_ids"]
            assert np.array_equal(out.global_rows("seek", f"at{i}"), want), (w, consumed)
            for r, windows in enumerate(_windows(out, "seek", f"at{i}", windex)):
                point = per_point[r][i]
                expected = windex.chunk_stems(windows.ravel())
                assert set(point["opened"]) == expected, (
                    f"W={w} rank {r} at consumed={consumed}: opened {sorted(point['opened'])}"
                    f", its batch lives in {sorted(expected)}")
                assert all(v == 1 for v in point["opened"].values())
                assert point["seconds"] < DEEP_SECONDS, (w, r, consumed, point["seconds"])
        assert np.array_equal(out.global_rows("seek", "restored"),
                              out.global_rows("seek", f"at{len(DEEP) - 1}"))
        for r, windows in enumerate(_windows(out, "seek", "restored", windex)):
            opened = set(out.ranks("seek")[r].info["restored_opened"])
            assert opened == windex.chunk_stems(windows.ravel()), (w, r)


# -- 6. evaluation ---------------------------------------------------------------------------------
def test_eval_sees_every_example_once_and_pads_with_masked_rows(
        runs: Runs, small_chunk_cache: Path, windex: WindowIndex) -> None:
    out = runs.by_world[2]
    ev = sw.TokenDataset(small_chunk_cache, seq_len=SEQ_LEN, seed=SEED, shuffle="none",
                         drop_last=False)
    n, step = len(ev), M * 2
    assert n % step, "the test needs a dataset length that M × W does not divide"
    steps = out.steps("eval", "run")
    assert steps == [-(-n // step)] * 2, f"ranks ran {steps} steps"
    rows = {k: out.global_rows("eval", "run", k) for k in ("input_ids", "labels", "loss_mask")}
    want = ev.__getitems__(np.arange(n))
    for key, got in rows.items():
        assert np.array_equal(got[:n], want[key]), key
    seen = windex.of(rows["input_ids"], rows["labels"])
    assert np.array_equal(seen[:n], np.arange(n)), "an example is missing or repeated"
    padding = slice(n, None)
    assert len(seen[padding]) == steps[0] * step - n > 0
    assert (seen[padding] == -1).all(), "padding duplicates a real example"
    assert (rows["loss_mask"][padding] == 0).all(), "padding rows must be fully masked"
    assert (rows["loss_mask"][:n].sum(axis=1) > 0).all(), "a real row is fully masked"
