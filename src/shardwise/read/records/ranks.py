"""A RecordStream among other processes: the ranks' one merged state (every rank's
streams, restoring any world size), "is every rank done" for padded evaluation, a rank's
share of a stream group it shares with other ranks (torch is only looked up, never
imported; the DataLoader worker a reader runs in: :func:`shardwise.read.guard.torch_worker`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from shardwise.checkpoint import LoaderState
from shardwise.errors import ConfigError, StateError
from shardwise.read.records.pipeline import FINISHED, Pipeline
from shardwise.world import StreamShare, World


def default_all_done(world: World) -> Callable[[bool], bool]:
    """An all-reduce over torch.distributed of "this rank is done" (world size 1: local)."""
    if world.size == 1:
        return lambda done: done
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ConfigError("eval_batches over several ranks needs all_done=... (a function "
                          "that is True when every rank is done) or torch.distributed")
    import torch

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"

    def all_done(done: bool) -> bool:
        flag = torch.tensor([int(done)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    return all_done


def gather_states(world: World, local: dict[str, Any]) -> dict[str, Any]:
    """Every rank's ``local`` state over torch.distributed, merged. Each rank validates
    the same gathered list, so a mismatch raises on all of them (none is left waiting)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ConfigError(f"state_dict(all_ranks=True) with world size {world.size} gathers "
                          "the ranks' states over torch.distributed, which is not "
                          "initialised: call torch.distributed.init_process_group first, or "
                          "save each rank's state_dict() and combine them with "
                          "shardwise.read.records.stream.merge_states")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (world.rank, world.size, local))
    if len(gathered) != world.size:
        raise ConfigError(f"state_dict(all_ranks=True): this reader's World has size "
                          f"{world.size}, torch.distributed has {len(gathered)} ranks; "
                          "save each data-parallel rank's state_dict() and combine them "
                          "with shardwise.read.records.stream.merge_states")
    ranks = sorted(int(r) for r, _, _ in gathered)
    if ranks != list(range(world.size)) or any(n != world.size for _, n, _ in gathered):
        raise ConfigError(f"state_dict(all_ranks=True): the processes' Worlds are "
                          f"{[(r, n) for r, n, _ in gathered]} (rank, size), expected ranks "
                          f"0..{world.size - 1} of {world.size} once each")
    return merge_states([st for _, _, st in gathered])


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state holding every stream of several consumers' states (e.g. all ranks'),
    which restores any world size; the states must come from the same data and config."""
    if not states:
        raise StateError("merge_states needs at least one state")
    parsed = [LoaderState.from_dict(s) for s in states]
    first = parsed[0]
    streams: dict[str, Any] = {}
    for i, st in enumerate(parsed):
        st.check_matches(first.kind, first.fingerprint, first.config)
        for k, v in dict(st.extra.get("streams", {})).items():
            if k in streams and streams[k] != v:
                raise StateError(f"states 0..{i} disagree on stream {k}: save every rank's "
                                 "state at the same step")
            streams[k] = v
    consumed = sum(int(v.get("consumed", 0)) for v in streams.values())
    extra = dict(first.extra, streams=dict(sorted(streams.items(), key=lambda kv: int(kv[0]))))
    return LoaderState(fingerprint=first.fingerprint, consumed=consumed, config=first.config,
                       extra=extra, kind=first.kind).to_dict()


def take_shared(pipe: Pipeline, share: StreamShare) -> Any:
    """The next example of this consumer's share of its group's order when ranks share
    the group's streams: the one position ``≡ offset (mod step)`` of the next ``step``,
    passing over the others' (so every rank sharing the group stands at the same
    position after each step, and their states agree)."""
    skip = (share.offset - pipe.taken) % share.step
    for _ in range(skip):
        if pipe.next() is FINISHED:
            return FINISHED
    x = pipe.next()
    for _ in range(share.step - skip - 1):
        if pipe.next() is FINISHED:
            break
    return x
