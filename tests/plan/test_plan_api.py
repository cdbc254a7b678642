"""The plan package's public names, and its promise to import only numpy and the stdlib."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import shardwise.plan as plan

PINNED = [
    "BLEND_VERSION", "BlendSchedule", "BlockShuffle", "DOC_SHUFFLE_VERSION", "DocShuffleIndex",
    "PERMUTATION_VERSION", "Permutation", "blend_index", "blend_slice",
    "build_doc_shuffle_index", "chunks_of_stream", "cu_seqlens", "cyclic_micro_batch_indices",
    "derive_seed", "document_boundaries", "epoch_and_offset", "eval_micro_batch_indices",
    "global_to_stream", "iter_micro_batches", "locate", "micro_batch_indices",
    "normalize_weights",
    "num_eval_steps", "num_micro_batches", "num_windows", "permutation", "permute_within",
    "plan_fingerprint", "position_ids", "rank_example_to_global", "shuffled_stream_chunks",
    "stream_to_global", "streams_of_rank", "streams_per_rank", "validate_batch_layout",
    "window_span", "write_doc_shuffle",
]


def test_all_is_sorted_and_pinned() -> None:
    assert plan.__all__ == sorted(plan.__all__)
    assert plan.__all__ == PINNED
    assert all(hasattr(plan, name) for name in plan.__all__)


def test_imports_only_numpy_stdlib_format_world_and_itself() -> None:
    """Plans are pure functions over integers: no torch, no I/O beyond atomic plan files
    and their checksums (format/checksum: a plan file a reader trusts carries one), read
    only from a regular file (format/confined: a FIFO planted as a plan is refused);
    the rank-slicing rules come from World and the integer rule from checkpoint.as_count
    (one place for each); a plan's memo is the one bounded cache (a plain LRU: no thread,
    no I/O)."""
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for path in Path(plan.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ok = name.startswith(("shardwise.plan", "shardwise.format.atomic",
                                      "shardwise.format.checksum",
                                      "shardwise.format.confined",
                                      "shardwise.world", "shardwise.choice",
                                      "shardwise.checkpoint", "shardwise.errors",
                                      "shardwise.concurrency.bounded"))
                assert top in allowed or ok, (path.name, name)


def test_versions_are_ints() -> None:
    assert {plan.PERMUTATION_VERSION, plan.DOC_SHUFFLE_VERSION, plan.BLEND_VERSION} == {1}
