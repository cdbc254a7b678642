"""Sources → processor → chunk writer, run by an executor; resumable from the ledger."""
