"""Where a cache lives and how it is opened: local directories and object stores, node-local
downloads, :class:`~shardwise.storage.cache.Cache` / ``open_cache``, ``verify`` and the
summary behind ``inspect``. Builds on :mod:`shardwise.format` (bytes and layout only)."""
