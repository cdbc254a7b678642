"""``from shardwise.megatron import build_pretraining_data_loader``: Megatron-LM's data
vocabulary over shardwise readers (needs the torch extra)."""

from shardwise.integrations.megatron import (
    GPTDataset,
    build_train_valid_test_datasets,
    get_blend_from_list,
    ltor_masks_and_position_ids,
    parse_split,
    split_ranges,
)
from shardwise.integrations.megatron_loader import (
    DataloaderType,
    build_pretraining_data_loader,
    global_batch_size_at,
    num_microbatches,
)

__all__ = ["DataloaderType", "GPTDataset", "build_pretraining_data_loader",
           "build_train_valid_test_datasets", "get_blend_from_list", "global_batch_size_at",
           "ltor_masks_and_position_ids", "num_microbatches", "parse_split", "split_ranges"]
