"""Readers over files other programs write: producer directories (chunk_NNNNN.jsonl) and
contiguous per-rank slices of shard files."""
