"""slime's dataset adapters (``slime/utils/hf_dataset.py``) over :class:`RecordStream`.

Porting is an import change; the calls slime's ``RolloutDataSource`` makes are the same::

    slime                                          shardwise.compat.slime
    HFIterableDatasetAdapter(path, dataset_size,   HFIterableDatasetAdapter(path,
        tokenizer, processor, max_length, *,           dataset_size=None, tokenizer=None,
        prompt_key="text", label_key=None,             processor=None, max_length=None, *,
        tool_key=None, metadata_key="metadata",        (the same keywords, and world=,
        seed=42, apply_chat_template=False,             streams= (default: up to 8, as
        apply_chat_template_kwargs=None, dp_size=1,     many as the data fills),
        num_workers=4, prefetch_factor=2,               range_bytes=, on_error=)
        shuffle_buffer_size=10000, do_shuffle=True)
    .get_next_batch(num_samples)                   the same: list of Sample
    .shuffle(new_epoch_id)                         the same (no-op for the current epoch)
    .get_checkpoint_state() / load_checkpoint_state(state)
                                                   the same keys (epoch_id, consumed_count,
                                                   global_consumed_count) + "shardwise"
    .set_train_parallel_config(config)             binds the DP layout late (see below)

slime saves a dataset's state only ``if hasattr(dataset, "get_checkpoint_state")``; here it
is exact: the saved position continues with the very next sample after a restart (slime's
HF path restores HF's iterator, whose shuffle buffer is lost). A state of another origin
(slime's ``hf_state_dict``) is refused, never silently restarted from zero.

Records: ``prompt_key`` (slime's ``--input-key``) holds a string or a list of chat
messages (``{"input": [{"role": "user", "content": ...}], "label": ...}``);
``apply_chat_template`` (``--apply-chat-template``) renders them with
``tokenizer.apply_chat_template(messages, tools=..., tokenize=False,
add_generation_prompt=True)`` (a string prompt becomes one user message first).
``label_key`` / ``metadata_key`` / ``tool_key`` as in slime. Prompts longer than
``max_length`` tokens are dropped and counted (``errors["too_long"]``); a record without
the prompt or label field raises naming file and line (``on_error="skip"`` counts it).
If every record of an epoch is dropped the reader raises with the counts.

Data parallelism: slime's data source is one process making data for every DP rank, so by
default the reader reads everything (``World.detect()``, rank 0 of 1 outside torchrun) and
``dp_size`` only sizes the read-ahead: ``prefetch_factor × dp_size`` records per task.
``set_train_parallel_config({"dp_size": N, "dp_rank": r})`` with a ``dp_rank`` binds the
reader to rank ``r`` of ``N`` instead (each rank reads only its share), allowed before the
first batch or right after ``load_checkpoint_state``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError, StateError
from shardwise.read.records.pool import Reject
from shardwise.read.records.ranges import plan_ranges, resolve_files
from shardwise.read.records.stream import RecordStream
from shardwise.sources.on_error import OnError
from shardwise.world import World

STATE_KEY = "shardwise"


@dataclass
class Sample:
    """The fields of slime's ``Sample`` the data source fills; where slime is installed the
    adapter returns ``slime.utils.types.Sample`` itself."""

    prompt: str | list[dict[str, Any]]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    multimodal_inputs: Any = None


@dataclass(frozen=True)
class Preprocess:
    """The ``map_fn``: one raw record → :class:`Sample`, or a counted rejection. A
    module-level class so that map workers can pickle it."""

    prompt_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str | None
    apply_chat_template: bool
    template_kwargs: tuple[tuple[str, Any], ...]
    tokenizer: Any
    max_length: int | None
    slime_sample: bool = False  # build slime.utils.types.Sample (slime is installed)

    def __call__(self, record: Any) -> Sample | Reject:
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        prompt = _field(record, self.prompt_key, "prompt_key (--input-key)")
        label = (_field(record, self.label_key, "label_key (--label-key)")
                 if self.label_key is not None else None)
        metadata = record.get(self.metadata_key) or {}
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        if not isinstance(metadata, dict):
            raise ValueError(f"field {self.metadata_key!r} (metadata_key) must be an object, "
                             f"got {type(metadata).__name__}")
        tools = self._tools(record)
        if tools is not None:
            metadata = {**metadata, "tools": tools}
        text = self._render(prompt, tools)
        if self.max_length is not None and self.tokenizer is not None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) > self.max_length:
                return Reject("too_long")
        cls: Any = Sample
        if self.slime_sample:
            cls = importlib.import_module("slime.utils.types").Sample
        return cls(prompt=text, label=label, metadata=metadata)  # type: ignore[no-any-return]

    def _tools(self, record: dict[str, Any]) -> list[Any] | None:
        if self.tool_key is None or record.get(self.tool_key) is None:
            return None
        tools = record[self.tool_key]
        tools = json.loads(tools) if isinstance(tools, str) else tools
        if not isinstance(tools, list):
            raise ValueError(f"field {self.tool_key!r} (tool_key) must be a list of tools, "
                             f"got {type(tools).__name__}")
        return tools

    def _render(self, prompt: Any, tools: list[Any] | None) -> Any:
        if isinstance(prompt, str):
            if not self.apply_chat_template:
                return prompt
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise ValueError(f"field {self.prompt_key!r} must be a string or a list of "
                             "{'role': ..., 'content': ...} messages")
        if not self.apply_chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            prompt, tools=tools, tokenize=False, add_generation_prompt=True,
            **dict(self.template_kwargs))


def fit_streams(path: Any, range_bytes: int, most: int = 8) -> int:
    """Up to ``most`` streams, fewer when the sources are too small to give each a range
    (a prompt file of a few KB). slime's data source is one consumer, so the number of
    streams only shapes the shuffle, never what is read."""
    files = resolve_files(path)
    n = most
    while n > 1:
        ranges = plan_ranges(files, range_bytes=range_bytes, n_streams=n).n
        if ranges >= n:
            break
        n = max(1, ranges)
    return n


def _field(record: dict[str, Any], key: str, option: str) -> Any:
    if key not in record:
        raise ValueError(f"the record has no field {key!r} ({option}); its fields are "
                         f"{sorted(record)[:10]}")
    return record[key]


class HFIterableDatasetAdapter:
    """slime's streaming adapter, over :class:`RecordStream` (see the module docstring).

    >>> ds = HFIterableDatasetAdapter("prompts.jsonl", tokenizer=tok,   # doctest: +SKIP
    ...         prompt_key="input", label_key="label", apply_chat_template=True)
    >>> samples = ds.get_next_batch(32); state = ds.get_checkpoint_state()  # doctest: +SKIP

    State keys (``get_checkpoint_state``): ``epoch_id`` (the epoch being served),
    ``consumed_count`` (samples of it received), ``global_consumed_count`` (all epochs),
    and ``shardwise`` (the reader's exact position, :meth:`RecordStream.state_dict`).
    """

    def __init__(self, path: Any, dataset_size: int | None = None, tokenizer: Any = None,
                 processor: Any = None, max_length: int | None = None, *,
                 prompt_key: str = "text", label_key: str | None = None,
                 tool_key: str | None = None, metadata_key: str = "metadata",
                 multimodal_keys: dict[str, str] | None = None, seed: int = 42,
                 apply_chat_template: bool = False,
                 apply_chat_template_kwargs: dict[str, Any] | None = None, dp_size: int = 1,
                 num_workers: int = 4, prefetch_factor: int = 2,
                 shuffle_buffer_size: int = 10000, do_shuffle: bool = True,
                 world: World | None = None, streams: int | None = None,
                 range_bytes: int = 64 << 20,
                 on_error: str | OnError = OnError.RAISE) -> None:
        if processor is not None or multimodal_keys:
            raise ConfigError("multimodal inputs (processor=, multimodal_keys=) are not "
                              "supported by shardwise's slime adapter; pass text or chat "
                              "prompts, or use slime's own adapter for multimodal data")
        if apply_chat_template and not callable(getattr(tokenizer, "apply_chat_template",
                                                        None)):
            raise ConfigError("apply_chat_template=True needs a tokenizer with "
                              "apply_chat_template (a transformers tokenizer), got "
                              f"{type(tokenizer).__name__}")
        if max_length is not None and tokenizer is None:
            raise ConfigError("max_length filters by token count and needs tokenizer=")
        self.dataset_size = dataset_size
        self.prefetch_factor = as_count(prefetch_factor, "prefetch_factor", minimum=1,
                                        error=ConfigError)
        self.dp_size = 1
        self.map_fn = Preprocess(prompt_key, label_key, metadata_key, tool_key,
                                 apply_chat_template,
                                 tuple(sorted((apply_chat_template_kwargs or {}).items())),
                                 tokenizer, max_length,
                                 importlib.util.find_spec("slime") is not None)
        if streams is None:
            streams = fit_streams(path, range_bytes)
        self.stream = RecordStream(path, map_fn=self.map_fn, seed=seed, world=world,
                                   streams=streams, range_bytes=range_bytes,
                                   shuffle_buffer=shuffle_buffer_size, shuffle=do_shuffle,
                                   num_workers=num_workers, on_error=on_error)
        self._set_dp_size(dp_size)
        self.global_consumed_count = 0

    # -- slime's interface --------------------------------------------------------------
    @property
    def epoch_id(self) -> int:
        return self.stream.epoch

    @property
    def consumed_count(self) -> int:
        """Samples of :attr:`epoch_id` received (by this reader's streams)."""
        return self.stream.epoch_consumed

    def __len__(self) -> int:
        if self.dataset_size is None:
            raise TypeError("len() of a streaming dataset needs dataset_size= (slime's "
                            "adapter takes it for epoch bookkeeping; shardwise does not "
                            "need it to find epoch ends)")
        return self.dataset_size

    def get_next_batch(self, num_samples: int) -> list[Sample]:
        """The next ``num_samples`` samples; epochs roll over (reshuffled) seamlessly."""
        n = as_count(num_samples, "num_samples", minimum=1, error=ConfigError)
        batch = self.stream.get_next_batch(n)
        self.global_consumed_count += len(batch)
        return batch

    def __iter__(self) -> Iterator[Sample]:
        while True:
            yield from self.get_next_batch(1)

    def shuffle(self, new_epoch_id: int) -> None:
        """Start epoch ``new_epoch_id`` from its beginning, in its own order; nothing
        changes if it is the epoch being served (slime calls this at every epoch start).
        slime's name for :meth:`RecordStream.set_epoch`."""
        if new_epoch_id != self.epoch_id:
            self.stream.set_epoch(new_epoch_id)

    def get_checkpoint_state(self) -> dict[str, Any]:
        return {"epoch_id": self.epoch_id, "consumed_count": self.consumed_count,
                "global_consumed_count": self.global_consumed_count,
                STATE_KEY: self.stream.state_dict()}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Continue exactly after the last sample the saved adapter returned."""
        if not isinstance(state, dict) or STATE_KEY not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise StateError(f"not a state of shardwise's slime adapter (keys {got}; expected "
                             f"{STATE_KEY!r} beside epoch_id/consumed_count/"
                             "global_consumed_count). A state saved by slime's own HF adapter "
                             "cannot continue here: resume from a checkpoint this adapter "
                             "saved, or start the data from zero on purpose")
        self.stream.load_state_dict(state[STATE_KEY])
        self.global_consumed_count = as_count(state.get("global_consumed_count", 0),
                                              "global_consumed_count", error=StateError)

    def set_train_parallel_config(self, config: dict[str, Any]) -> None:
        """slime's late DP layout: ``dp_size`` sizes the read-ahead; with ``dp_rank`` the
        reader is bound to that rank of ``dp_size`` (:meth:`RecordStream.bind`)."""
        if not isinstance(config, dict) or "dp_size" not in config:
            raise ConfigError(f"set_train_parallel_config expects a dict with 'dp_size', got "
                              f"{config!r}")
        dp_size = self._set_dp_size(config["dp_size"])
        if config.get("dp_rank") is not None:
            self.stream.bind(World(config["dp_rank"], dp_size))

    def close(self) -> None:
        self.stream.close()

    # -- internals --------------------------------------------------------------------------
    def _set_dp_size(self, dp_size: Any) -> int:
        self.dp_size = as_count(dp_size, "dp_size", minimum=1, error=ConfigError)
        self.stream.set_read_ahead(self.prefetch_factor * self.dp_size)
        return self.dp_size


__all__ = ["HFIterableDatasetAdapter", "Preprocess", "Sample"]
