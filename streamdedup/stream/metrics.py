"""The worker's Prometheus metrics: one registry, shared with faust's own sensor metrics.

Names follow Prometheus conventions, and ``promtool check metrics`` passes on a live scrape
(tests/integration/test_prometheus.py): ``_total`` counters, base units spelled out
(``_seconds``, ``_bytes``), no ``_created`` series (``disable_created_metrics``: they double the
series count and no query here uses them).  Labels are bounded sets (verdict, reason, stage,
topic, partition number), never a URL or id.  faust's own sensor is replaced by
:func:`faust_metrics`, the same metrics under conforming names, timed in seconds.
The Grafana dashboard (``deploy/grafana/``) and the alert rules (``deploy/prometheus/``) refer
to these names; ``tests/test_deploy.py`` checks that every name they use exists here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from streamdedup.stream.memory import memory_limit_bytes, worker_memory_bytes

if TYPE_CHECKING:
    from streamdedup.settings import Settings

__all__ = ["Metrics", "FAUST_PREFIX", "LATENCY_BUCKETS", "DISTANCE_BUCKETS", "faust_metrics", "setup_faust_sensor"]

disable_created_metrics()  # process-wide; every registry of the worker is served without them

#: faust's sensor metrics are named ``<prefix>_messages_received_total`` etc.
FAUST_PREFIX = "streamdedup_faust"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The phases of streamdedup_page_phase_seconds, in a page's order (their sum is its latency).
PHASES = ("read", "fingerprint", "answers", "commit")
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DISTANCE_BUCKETS = tuple(float(d) for d in range(0, 17))
SIMILARITY_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0)


@dataclass
class Metrics:
    """Every metric the worker exports (construct once per registry)."""

    pages: Counter
    verdicts: Counter
    dead_letters: Counter
    match_distance: Histogram
    match_similarity: Histogram
    latency: Histogram
    phase: Histogram
    batch_seconds: Histogram
    shard_fingerprints: Gauge
    shard_bytes: Gauge
    shard_file_bytes: Gauge
    changelog_owed: Gauge
    recovery_restored: Gauge
    recovery_target: Gauge
    recovery_seconds: Gauge
    consumer_lag: Gauge
    rebalances: Counter
    offsets_skipped: Counter
    probes: Counter
    errors: Counter
    index_memory_limit: Gauge
    worker_memory: Gauge
    memory_limit: Gauge
    table_groups: Gauge
    info: Gauge
    check_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> Metrics:
        r: dict[str, Any] = {"registry": registry}
        return cls(
            pages=Counter("streamdedup_pages", "Records read from the pages topic (good and bad).", **r),
            verdicts=Counter("streamdedup_verdicts", "Verdicts sent, by kind.", ["verdict"], **r),
            dead_letters=Counter(
                "streamdedup_dead_letters", "Records sent to the dead-letter topic, by reason.", ["reason"], **r
            ),
            match_distance=Histogram(
                "streamdedup_match_distance",
                "Hamming distance (differing bits) of each near-duplicate to its match.",
                buckets=DISTANCE_BUCKETS,
                **r,
            ),
            match_similarity=Histogram(
                "streamdedup_match_similarity",
                "Estimated resemblance of each near-duplicate to its match (--algorithm minhash only).",
                buckets=SIMILARITY_BUCKETS,
                **r,
            ),
            latency=Histogram(
                "streamdedup_verdict_latency_seconds",
                "From the page's Kafka timestamp (produce time) to its verdict being committed.",
                buckets=LATENCY_BUCKETS,
                **r,
            ),
            phase=Histogram(
                "streamdedup_page_phase_seconds",
                "Where a page's verdict latency goes, by phase: read (Kafka timestamp to its batch "
                "taken: fetch, buffer, batch timer), fingerprint (batch taken to its probes sent), "
                "answers (probes sent to the last shard answer in), commit (to its verdict committed).",
                ["phase"],
                buckets=PHASE_BUCKETS,
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
            shard_file_bytes=Gauge(
                "streamdedup_shard_file_bytes",
                "Bytes of a shard's row files on disk (ids, URLs, fetch times, id hashes), beside its snapshots.",
                ["partition"],
                **r,
            ),
            changelog_owed=Gauge(
                "streamdedup_changelog_owed_rows",
                "Rows stored in this worker's shards whose changelog write failed, sent again with their "
                "shard's next rows. Above 0 for long: the shard changelog cannot be written, and a shard "
                "rebuilt from it elsewhere would lack these pages.",
                **r,
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
            offsets_skipped=Counter(
                "streamdedup_offsets_skipped",
                "Pages offsets the outbox committed past without a record: empty (a read found no record "
                "there: a transaction marker or compaction) or unread (the worker could not read it).",
                ["why"],
                **r,
            ),
            probes=Counter(
                "streamdedup_probes",
                "Probes of this worker's pages (one per page and table group), by path: local (to a shard "
                "partition this worker owns, --local-shards) or topic (through the probes and answers topics).",
                ["path"],
                **r,
            ),
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
            worker_memory=Gauge(
                "streamdedup_worker_memory_bytes",
                "Resident memory of the worker's process and all its child processes (the "
                "fingerprinting processes), read at each scrape.",
                **r,
            ),
            memory_limit=Gauge(
                "streamdedup_worker_memory_limit_bytes",
                "Memory the worker may use, for the memory alert: --memory-limit if set, else the "
                "container's cgroup limit, else the machine's memory.",
                **r,
            ),
            table_groups=Gauge(
                "streamdedup_table_groups",
                "Table groups of the design: each page is stored once per group, so pages = fingerprints / groups.",
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
                ["app_id", "algorithm", "k", "tables", "partitions"],
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
        for path in ("local", "topic"):
            self.probes.labels(path)
        for stage in ("pages", "shard", "answers"):
            self.errors.labels(stage)
            self.batch_seconds.labels(stage)
        for phase in PHASES:
            self.phase.labels(phase)
        self.check_seconds.labels("200")
        self.worker_memory.set_function(worker_memory_bytes)

    def configure(self, settings: Settings, tables: int, groups: int) -> None:
        """The gauges that describe the worker: its limits and its configuration."""
        s = settings
        self.index_memory_limit.set(s.index_memory_limit)
        self.memory_limit.set(memory_limit_bytes(s.memory_limit)[0])
        self.table_groups.set(groups)
        self.info.labels(s.app_id, s.algorithm, str(s.k), str(tables), str(s.partitions)).set(1)


# ---------------------------------------------------------------------------- faust's sensor

#: faust's latency buckets (milliseconds, ``faust.sensors.prometheus.MS_LATENCY_BUCKETS``) in seconds.
FAUST_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class MillisecondsHistogram(Histogram):
    """A seconds histogram that faust's monitor feeds in milliseconds (``Monitor.ms_since``).
    For unlabelled histograms only (faust's are): a labelled child would divide again."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        super().observe(amount / 1000.0, exemplar)


def faust_metrics(registry: CollectorRegistry = REGISTRY, prefix: str = FAUST_PREFIX) -> Any:
    """faust's ``FaustMetrics`` under names ``promtool check metrics`` accepts: latencies in
    ``_seconds`` (faust's ``_ms`` / unit-less names held milliseconds), counters without a
    ``total_`` prefix, and the rebalance gauges named for what they count (in progress)."""
    from faust.sensors.prometheus import FaustMetrics

    r: dict[str, Any] = {"registry": registry}

    def seconds(name: str, help: str) -> Histogram:
        return MillisecondsHistogram(f"{prefix}_{name}_seconds", help, buckets=FAUST_SECONDS_BUCKETS, **r)

    tp = ["topic", "partition"]
    return FaustMetrics(
        messages_received=Counter(f"{prefix}_messages_received", "Messages received.", **r),
        active_messages=Gauge(f"{prefix}_active_messages", "Messages received and not yet acknowledged.", **r),
        messages_received_per_topics=Counter(
            f"{prefix}_messages_received_per_topic", "Messages received, by topic.", ["topic"], **r
        ),
        messages_received_per_topics_partition=Gauge(
            f"{prefix}_messages_received_offset", "Offset of the last message received, by partition.", tp, **r
        ),
        events_runtime_latency=seconds("events_runtime", "Time a stream spent on an event."),
        total_events=Counter(f"{prefix}_events", "Stream events received.", **r),
        total_active_events=Gauge(f"{prefix}_active_events", "Stream events being processed.", **r),
        total_events_per_stream=Counter(f"{prefix}_events_per_stream", "Stream events, by stream.", ["stream"], **r),
        table_operations=Counter(
            f"{prefix}_table_operations", "Table operations, by table and operation.", ["table", "operation"], **r
        ),
        topic_messages_sent=Counter(f"{prefix}_topic_messages_sent", "Messages sent, by topic.", ["topic"], **r),
        total_sent_messages=Counter(f"{prefix}_messages_sent", "Messages sent.", **r),
        producer_send_latency=seconds("producer_send_latency", "From a send to its acknowledgement."),
        total_error_messages_sent=Counter(f"{prefix}_messages_send_errors", "Messages that could not be sent.", **r),
        producer_error_send_latency=seconds("producer_error_send_latency", "From a send to its failure."),
        assignment_operations=Counter(
            f"{prefix}_assignment_operations", "Partition assignments, by outcome.", ["operation"], **r
        ),
        assign_latency=seconds("assign_latency", "Time to compute a partition assignment."),
        total_rebalances=Gauge(f"{prefix}_rebalances_in_progress", "Rebalances started and not yet returned.", **r),
        total_rebalances_recovering=Gauge(
            f"{prefix}_rebalances_recovering", "Rebalances returned and still recovering tables.", **r
        ),
        rebalance_done_consumer_latency=seconds(
            "rebalance_done_consumer_latency", "From the rebalance's start to the consumer's reply."
        ),
        rebalance_done_latency=seconds("rebalance_done_latency", "From the rebalance's start to its end (recovered)."),
        count_metrics_by_name=Gauge(f"{prefix}_metrics_by_name", "faust's named counts.", ["metric"], **r),
        http_status_codes=Counter(f"{prefix}_http_responses", "Web responses, by HTTP status.", ["status_code"], **r),
        http_latency=seconds("http_latency", "Time to answer a web request."),
        topic_partition_end_offset=Gauge(f"{prefix}_topic_partition_end_offset", "End offset, by partition.", tp, **r),
        topic_partition_offset_commited=Gauge(
            f"{prefix}_topic_partition_committed_offset", "Committed offset, by partition.", tp, **r
        ),
        consumer_commit_latency=seconds("consumer_commit_latency", "Time to commit the consumer's offsets."),
    )


def setup_faust_sensor(app: Any, registry: CollectorRegistry = REGISTRY) -> None:
    """faust's Prometheus monitor with :func:`faust_metrics`, and ``/metrics`` serving ``registry``
    (``faust.sensors.prometheus.setup_prometheus_sensors`` with conforming names)."""
    from faust.sensors.prometheus import PrometheusMonitor
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    app.monitor = PrometheusMonitor(metrics=faust_metrics(registry))

    @app.page("/metrics")
    async def metrics_handler(self: Any, request: Any) -> Any:
        from aiohttp.web import Response

        return Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}, status=200)
