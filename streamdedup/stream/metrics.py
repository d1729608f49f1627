"""The worker's Prometheus metrics: one registry, shared with faust's own sensor metrics.

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` and ``_bytes`` units);
labels are bounded sets (verdict, reason, stage, topic, partition number), never a URL or id.
The Grafana dashboard (``deploy/grafana/``) and the alert rules (``deploy/prometheus/``) refer
to these names; ``tests/test_deploy.py`` checks that every name they use exists here or in
faust's sensor (prefix ``streamdedup_faust``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics", "FAUST_PREFIX", "LATENCY_BUCKETS", "DISTANCE_BUCKETS"]

#: faust's sensor metrics are named ``<prefix>_messages_received_total`` etc.
FAUST_PREFIX = "streamdedup_faust"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DISTANCE_BUCKETS = tuple(float(d) for d in range(0, 17))


@dataclass
class Metrics:
    """Every metric the worker exports (construct once per registry)."""

    pages: Counter
    verdicts: Counter
    dead_letters: Counter
    match_distance: Histogram
    latency: Histogram
    batch_seconds: Histogram
    shard_fingerprints: Gauge
    shard_bytes: Gauge
    recovery_restored: Gauge
    recovery_target: Gauge
    recovery_seconds: Gauge
    consumer_lag: Gauge
    rebalances: Counter
    errors: Counter
    index_memory_limit: Gauge
    info: Gauge
    check_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> Metrics:
        r = {"registry": registry}
        return cls(
            pages=Counter("streamdedup_pages", "Records read from the pages topic (good and bad).", **r),
            verdicts=Counter("streamdedup_verdicts", "Verdicts sent, by kind.", ["verdict"], **r),
            dead_letters=Counter(
                "streamdedup_dead_letters", "Records sent to the dead-letter topic, by reason.", ["reason"], **r
            ),
            match_distance=Histogram(
                "streamdedup_match_distance_bits",
                "Hamming distance of each near-duplicate to its match.",
                buckets=DISTANCE_BUCKETS,
                **r,
            ),
            latency=Histogram(
                "streamdedup_verdict_latency_seconds",
                "From the page's Kafka timestamp (produce time) to its verdict being committed.",
                buckets=LATENCY_BUCKETS,
                **r,
            ),
            batch_seconds=Histogram(
                "streamdedup_batch_seconds",
                "Time to process one batch, by stage "
                "(pages: parse + fingerprint; shard: probe + insert; answers: route + "
                "commit).",
                ["stage"],
                buckets=BATCH_BUCKETS,
                **r,
            ),
            shard_fingerprints=Gauge(
                "streamdedup_shard_fingerprints",
                "Fingerprints stored in a shard (one per page and table group).",
                ["partition"],
                **r,
            ),
            shard_bytes=Gauge(
                "streamdedup_shard_bytes", "Memory held by a shard's tables and columns.", ["partition"], **r
            ),
            recovery_restored=Gauge(
                "streamdedup_recovery_restored_records",
                "Changelog records restored since the current recovery started.",
                **r,
            ),
            recovery_target=Gauge(
                "streamdedup_recovery_target_records",
                "Changelog records the current recovery still has to restore (0 when not recovering).",
                **r,
            ),
            recovery_seconds=Gauge(
                "streamdedup_recovery_last_duration_seconds", "How long the last recovery took.", **r
            ),
            consumer_lag=Gauge(
                "streamdedup_consumer_lag_messages",
                "Records behind the end of each assigned "
                "partition: for the pages topic, not yet committed (judged); for the internal "
                "probes and answers topics, not yet read.",
                ["topic", "partition"],
                **r,
            ),
            rebalances=Counter("streamdedup_rebalances", "Consumer group rebalances this worker took part in.", **r),
            errors=Counter(
                "streamdedup_errors",
                "Unexpected errors, by stage. pages: the batch went to the "
                "dead-letter topic (internal_error); shard, answers: one failed attempt (a batch is "
                "retried with backoff, and after 5 failures its pages go to the dead-letter topic as "
                "internal_error); answers also counts failed flushes.",
                ["stage"],
                **r,
            ),
            index_memory_limit=Gauge(
                "streamdedup_index_memory_limit_bytes",
                "The configured limit on index memory per worker (0: none).",
                **r,
            ),
            check_seconds=Histogram(
                "streamdedup_check_seconds",
                "Time to answer a POST /check, by HTTP status.",
                ["status"],
                buckets=LATENCY_BUCKETS,
                **r,
            ),
            info=Gauge(
                "streamdedup_worker_info",
                "Constant 1, with the worker's configuration as labels.",
                ["app_id", "algorithm", "k", "design", "partitions"],
                **r,
            ),
        )

    def __post_init__(self) -> None:
        # every label value exists from the start, so rates read 0 rather than nothing
        from streamdedup.errors import REASONS

        for verdict in ("unique", "near_duplicate"):
            self.verdicts.labels(verdict)
        for reason in REASONS:
            self.dead_letters.labels(reason)
        for stage in ("pages", "shard", "answers"):
            self.errors.labels(stage)
            self.batch_seconds.labels(stage)
