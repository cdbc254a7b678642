"""The seed systems' own classes, thin over shardwise's readers: porting is an import.

* :mod:`shardwise.compat.swift` — ms-swift's ``LazyShardedDataset`` (the producer-directory
  plan) over :class:`~shardwise.read.external.producer_dir.ProducerDirDataset`.
* :mod:`shardwise.compat.llm` — llm.datasets' ``DistributedShardedDataset`` and
  ``ResumableSequentialSampler`` over
  :class:`~shardwise.read.external.contiguous.ContiguousShards`.
* :mod:`shardwise.compat.slime` — slime's ``HFIterableDatasetAdapter`` (``get_next_batch``,
  ``shuffle(new_epoch_id)``, ``get/load_checkpoint_state``, ``set_train_parallel_config``)
  over :class:`~shardwise.read.records.stream.RecordStream`.

Each module's docstring sets the original signature beside shardwise's and says where the
behaviour differs on purpose (where the original would lose or repeat data).
"""
