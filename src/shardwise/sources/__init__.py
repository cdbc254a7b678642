"""Source files: discovery (Hugging Face folders and datasets too: ``hf.py``), byte-range
segments, JSONL / Parquet / Arrow records, dotted field keys, OnError.

Shared by the writer (which tokenizes sources into a cache) and the raw-record readers
(which stream sources as they are), so neither imports the other."""
