"""The worker's stages that need no Kafka: intake, the shard step, pending answers, routing, and the wire format."""
