"""The in-order engine: page records and their readers, the Deduplicator, and `scan` (one process, no Kafka)."""
