"""Raw records (SFT, RL prompts): RecordStream (O(1) start, shuffle buffer, exact resume),
its ranges, streams, process pool and pipeline, and SequentialConsumer."""
