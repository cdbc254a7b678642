"""Object stores (``s3://``, ``gs://``, ``az://``, ``memory://``…): the one client every
layer above reaches them through — the cache's storage, bucket sources, the build's
writers — with one fault policy (timeouts, bounded retries). Its own layer, between
``format`` and ``storage`` / ``sources`` (``storage.bucket.BucketStore`` implements the
format's ``Files`` over it)."""

from shardwise.remote.client import RemoteStore, is_url
from shardwise.remote.policy import DEFAULT_POLICY, RemotePolicy, is_transient

__all__ = ["DEFAULT_POLICY", "RemotePolicy", "RemoteStore", "is_transient", "is_url"]
