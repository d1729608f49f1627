"""The faust shell around the core: the worker app, its shard store, outbox and metrics."""
