"""Bytes on disk and nothing else: chunk files, manifest, ledger, checksums, publication.

See ``SPEC.md`` beside this file. Imports numpy, xxhash, orjson and (lazily) pyarrow; never
torch or ray.
"""
