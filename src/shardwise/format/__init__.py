"""Bytes on disk and nothing else: chunk files, manifest, ledger, checksums, publication.

See ``SPEC.md`` beside this file. Imports numpy, xxhash, orjson and (lazily) pyarrow; never
torch, ray or fsspec: an object store is reached through the small
:class:`~shardwise.format.files.Files` interface, implemented for a directory here
(:class:`~shardwise.format.files.LocalFiles`) and for an object store by
:mod:`shardwise.storage` (``BucketStore``).
"""
