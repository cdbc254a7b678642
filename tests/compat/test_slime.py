"""shardwise.compat.slime, called exactly as slime's RolloutDataSource calls its HF adapters:
chat-template input, the input/label/metadata/tool keys, epochs, late DP binding, and the
save → SIGKILL → load cycle of a real process continuing exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shardwise.compat.slime import HFIterableDatasetAdapter, Sample
from shardwise.errors import ConfigError, InputError, StateError
from shardwise.read.records.stream import RecordStream
from shardwise.world import World

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
N = 300
BATCH, SAVE_EVERY, KILL_AFTER, RESUMED_STEPS = 16, 3, 24, 12  # an epoch is ~19 steps


def write_prompts(path: Path, n: int = N) -> Path:
    """slime's --apply-chat-template input: {"input": [messages], "label": ...}."""
    with open(path, "w") as f:
        for i in range(n):
            msgs = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": f"what is {i} + {i}?" + " pad" * (i % 7)}]
            f.write(json.dumps({"input": msgs, "label": str(2 * i),
                                "meta": {"id": i}, "tools": None}) + "\n")
    return path


def tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "sample" / "tokenizer.json"))
    tok.chat_template = TEMPLATE
    return tok


def adapter(path: Path, **kw: Any) -> HFIterableDatasetAdapter:
    opts: dict[str, Any] = dict(prompt_key="input", label_key="label", metadata_key="meta",
                                seed=3, num_workers=0, shuffle_buffer_size=32,
                                range_bytes=2000, streams=4)
    opts.update(kw)
    return HFIterableDatasetAdapter(str(path), **opts)


def ids(samples: list[Sample]) -> list[int]:
    return [s.metadata["id"] for s in samples]


def test_chat_template_input_is_rendered_not_rejected(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl")
    ds = adapter(path, tokenizer=tokenizer(), apply_chat_template=True)
    batch = ds.get_next_batch(N)
    assert sorted(ids(batch)) == list(range(N)) and ds.stream.errors == {}
    s = batch[0]
    i = s.metadata["id"]
    assert s.prompt.startswith("<|system|>be brief\n<|user|>what is ") and s.prompt.endswith(
        "<|assistant|>")
    assert s.label == str(2 * i) and s.metadata == {"id": i}
    # without the template the messages are the prompt, as slime's _build_messages keeps them
    plain = adapter(path).get_next_batch(1)[0]
    assert isinstance(plain.prompt, list) and plain.prompt[1]["role"] == "user"


def test_max_length_drops_are_counted_and_all_dropped_raises(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl")
    tok = tokenizer()
    lengths = sorted(len(tok.encode(tok.apply_chat_template(
        json.loads(line)["input"], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False)) for line in path.read_text().splitlines())
    limit = lengths[N // 2]
    ds = adapter(path, tokenizer=tok, max_length=limit, apply_chat_template=True)
    kept = sum(n <= limit for n in lengths)
    assert len(set(ids(ds.get_next_batch(kept)))) == kept
    assert ds.stream.errors == {"too_long": N - kept}
    none = adapter(path, tokenizer=tok, max_length=1, apply_chat_template=True)
    with pytest.raises(ConfigError, match=rf"read {N} records in epoch 0 and produced no "
                                          rf"example: every one was rejected \(too_long: {N}\)"):
        none.get_next_batch(4)


def test_missing_fields_are_named(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", 20)
    with pytest.raises(InputError, match=r"p.jsonl:\d+:.*no field 'prompt' \(prompt_key"):
        adapter(path, prompt_key="prompt").get_next_batch(1)
    skip = adapter(path, label_key="answer", on_error="skip")
    with pytest.raises(ConfigError, match=r"every one was rejected \(map_error: 20\)"):
        skip.get_next_batch(1)
    with pytest.raises(ConfigError, match="needs a tokenizer with apply_chat_template"):
        adapter(path, apply_chat_template=True)


def test_epochs_roll_over_once_each_and_shuffle_is_slimes(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl")
    ds = adapter(path)
    first = ids(ds.get_next_batch(N))
    assert sorted(first) == list(range(N)) and ds.epoch_id == 0 and ds.consumed_count == N
    second = ids(ds.get_next_batch(N + 5))
    assert sorted(second[:N]) == list(range(N)) and second[:N] != first
    assert ds.epoch_id == 2 and ds.consumed_count == 5 and ds.global_consumed_count == 2 * N + 5
    ds.shuffle(2)  # slime calls shuffle(epoch_id) at each epoch start: the current one, no-op
    assert ds.consumed_count == 5
    ds.shuffle(1)
    assert ids(ds.get_next_batch(N)) == second[:N]
    state = ds.get_checkpoint_state()
    assert {"epoch_id", "consumed_count", "global_consumed_count", "shardwise"} <= set(state)
    with pytest.raises(StateError, match="slime's own HF adapter cannot continue here"):
        adapter(path).load_checkpoint_state({"epoch_id": 1, "consumed_count": 3,
                                             "global_consumed_count": 9,
                                             "hf_state_dict": {}})


def test_set_train_parallel_config_binds_the_dp_rank_late(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl")
    ds = adapter(path, prefetch_factor=3)
    ds.set_train_parallel_config({"dp_size": 4})  # slime: one data source for every rank
    assert ds.stream.world == World(0, 1) and ds.stream.config.task_size == 12
    want = [ids(adapter(path, world=World(r, 2)).get_next_batch(40)) for r in range(2)]
    for r in range(2):
        late = adapter(path)
        late.set_train_parallel_config({"dp_size": 2, "dp_rank": r})
        assert ids(late.get_next_batch(40)) == want[r]
        with pytest.raises(ConfigError, match="already read"):
            late.set_train_parallel_config({"dp_size": 4, "dp_rank": 0})
    one = adapter(path)
    ref = ids(one.get_next_batch(100))
    rank = adapter(path)
    saved = adapter(path)
    saved.get_next_batch(60)
    rank.load_checkpoint_state(saved.get_checkpoint_state())
    rank.set_train_parallel_config({"dp_size": 2, "dp_rank": 1})
    assert ids(rank.get_next_batch(20)) == ref[61::2]


# -- save → SIGKILL → load, in real processes ------------------------------------------------
def child(args: dict[str, Any]) -> None:
    """Run the adapter as slime's data source: a batch per step, a checkpoint every
    SAVE_EVERY steps (written atomically, then announced on stdout)."""
    ds = adapter(Path(args["data"]))
    ckpt = Path(args["ckpt"])
    if args["mode"] == "resume":
        ds.load_checkpoint_state(json.loads(ckpt.read_text()))
    step = ds.global_consumed_count // BATCH
    with open(args["out"], "a") as out:
        while args["mode"] == "run" or step < args["until"]:
            out.write(json.dumps({"step": step, "ids": ids(ds.get_next_batch(BATCH))}) + "\n")
            out.flush()
            step += 1
            if step % SAVE_EVERY == 0:
                tmp = ckpt.with_suffix(".tmp")
                tmp.write_text(json.dumps(ds.get_checkpoint_state()))
                os.replace(tmp, ckpt)
                print(f"saved {step}", flush=True)


def _spawn(args: dict[str, Any]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, __file__, json.dumps(args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_save_kill_load_continues_exactly(tmp_path: Path) -> None:
    data = write_prompts(tmp_path / "p.jsonl")
    args = {"data": str(data), "ckpt": str(tmp_path / "ckpt.json"),
            "out": str(tmp_path / "killed.jsonl"), "mode": "run"}
    with _spawn(args) as proc:  # closes its pipes
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:  # block on the child's own announcements
            if int(line.split()[1]) >= KILL_AFTER:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    at = saved["global_consumed_count"] // BATCH
    assert at >= KILL_AFTER and saved["epoch_id"] >= 1  # the checkpoint is past an epoch end
    resumed = _spawn({**args, "mode": "resume", "out": str(tmp_path / "resumed.jsonl"),
                      "until": at + RESUMED_STEPS})
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    ref = adapter(data)
    want = [ids(ref.get_next_batch(BATCH)) for _ in range(at + RESUMED_STEPS)]
    killed = [json.loads(x) for x in (tmp_path / "killed.jsonl").read_text().splitlines()]
    tail = [json.loads(x) for x in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert [r["ids"] for r in killed[:at]] == want[:at]
    assert [r["step"] for r in tail] == list(range(at, at + RESUMED_STEPS))
    assert [r["ids"] for r in tail] == want[at:]
    seen = Counter(i for batch in want[:at] + [r["ids"] for r in tail] for i in batch)
    assert max(seen.values()) - min(seen.values()) <= 1  # whole epochs: each record alike


def test_the_reader_underneath_is_a_record_stream(tmp_path: Path) -> None:
    ds = adapter(write_prompts(tmp_path / "p.jsonl", 40))
    assert isinstance(ds.stream, RecordStream)
    with pytest.raises(TypeError, match="dataset_size"):
        len(ds)
    assert len(adapter(tmp_path / "p.jsonl", dataset_size=40)) == 40
    small = adapter(tmp_path / "p.jsonl", streams=None, range_bytes=64 << 20)  # the default
    assert 1 <= small.stream.config.streams <= 8  # as many streams as a few KB can fill
    assert sorted(ids(small.get_next_batch(40))) == list(range(40))


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))


def test_slimes_own_sample_type_when_slime_is_installed(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "slime" / "utils"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "types.py").write_text("from dataclasses import dataclass, field\n\n"
                                  "@dataclass\nclass Sample:\n    prompt: object = ''\n"
                                  "    label: object = None\n"
                                  "    metadata: dict = field(default_factory=dict)\n"
                                  "    index: object = None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("slime", "slime.utils", "slime.utils.types"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    got = adapter(write_prompts(tmp_path / "p.jsonl", 10), streams=None).get_next_batch(2)
    assert type(got[0]).__module__ == "slime.utils.types" and got[0].index is None
