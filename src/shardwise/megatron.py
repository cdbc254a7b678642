"""``from shardwise.megatron import build_pretraining_data_loader``: Megatron-LM's data
vocabulary over shardwise readers (needs the torch extra)."""

from shardwise.integrations.megatron import (
    DataloaderType,
    GPTDataset,
    build_pretraining_data_loader,
    build_train_valid_test_datasets,
    get_blend_from_list,
    global_batch_size_at,
    ltor_masks_and_position_ids,
    num_microbatches,
    parse_split,
    split_ranges,
)

__all__ = ["DataloaderType", "GPTDataset", "build_pretraining_data_loader",
           "build_train_valid_test_datasets", "get_blend_from_list", "global_batch_size_at",
           "ltor_masks_and_position_ids", "num_microbatches", "parse_split", "split_ranges"]
