"""plan: pure, vectorised numpy functions from integers (sizes, seeds, epochs) to orders.

Nothing here reads token data. Modules, in the order a read path uses them:

* ``permutation``  keyed Feistel permutation of ``range(n)``, per index, O(1) memory
* ``windows``      packing documents into ``seq_len + 1`` token windows
* ``block_shuffle`` shuffled order that reads blocks of consecutive windows
* ``doc_shuffle``  Megatron-style document shuffle, cached as memory-mapped ``.npy``
* ``blend``        mixture of sources within one example of the weights at every prefix
* ``batches``      which positions each rank reads (single / cyclic / eval)
* ``stream``       stream placement: ``R*`` virtual readers over chunks

Versions recorded in checkpoints: ``PERMUTATION_VERSION``, ``DOC_SHUFFLE_VERSION``,
``BLEND_VERSION``.
"""

from shardwise.plan.batches import (
    cyclic_micro_batch_indices,
    epoch_and_offset,
    eval_micro_batch_indices,
    iter_micro_batches,
    micro_batch_indices,
    num_eval_steps,
    num_micro_batches,
    validate_batch_layout,
)
from shardwise.plan.blend import (
    BLEND_VERSION,
    BlendSchedule,
    blend_index,
    blend_slice,
    normalize_weights,
)
from shardwise.plan.block_shuffle import BlockShuffle
from shardwise.plan.doc_shuffle import (
    DOC_SHUFFLE_VERSION,
    DocShuffleIndex,
    build_doc_shuffle_index,
    plan_fingerprint,
    write_doc_shuffle,
)
from shardwise.plan.permutation import (
    PERMUTATION_VERSION,
    Permutation,
    derive_seed,
    permutation,
    permute_within,
)
from shardwise.plan.stream import (
    chunks_of_stream,
    global_to_stream,
    rank_example_to_global,
    shuffled_stream_chunks,
    stream_to_global,
    streams_of_rank,
    streams_per_rank,
)
from shardwise.plan.windows import (
    cu_seqlens,
    document_boundaries,
    locate,
    num_windows,
    position_ids,
    window_span,
)

__all__ = [
    "BLEND_VERSION",
    "BlendSchedule",
    "BlockShuffle",
    "DOC_SHUFFLE_VERSION",
    "DocShuffleIndex",
    "PERMUTATION_VERSION",
    "Permutation",
    "blend_index",
    "blend_slice",
    "build_doc_shuffle_index",
    "chunks_of_stream",
    "cu_seqlens",
    "cyclic_micro_batch_indices",
    "derive_seed",
    "document_boundaries",
    "epoch_and_offset",
    "eval_micro_batch_indices",
    "global_to_stream",
    "iter_micro_batches",
    "locate",
    "micro_batch_indices",
    "normalize_weights",
    "num_eval_steps",
    "num_micro_batches",
    "num_windows",
    "permutation",
    "permute_within",
    "plan_fingerprint",
    "position_ids",
    "rank_example_to_global",
    "shuffled_stream_chunks",
    "stream_to_global",
    "streams_of_rank",
    "streams_per_rank",
    "validate_batch_layout",
    "window_span",
    "write_doc_shuffle",
]
