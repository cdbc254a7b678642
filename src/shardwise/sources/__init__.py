"""Source files: discovery, byte-range segments, JSONL / Parquet records, OnError.

Shared by the writer (which tokenizes sources into a cache) and the raw-record readers
(which stream sources as they are), so neither imports the other."""
