"""Sources → processor → chunk writer, run by an executor; resumable from the ledger.

``shardwise.build`` is the function :func:`shardwise.writer.api.build`; this package is the
machinery behind it (it is not called ``build`` so that the function shadows nothing)."""
