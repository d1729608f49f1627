"""The worker's gauges, refreshed every 5 s: shard sizes, consumer lag, recovery progress.

Series of partitions that moved to another worker are removed, so a dashboard never sums a
shard twice or shows a frozen lag.  The worker hands in what it reads (the shards, faust's
consumer and recovery, the committed offsets): this module never reaches into the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamdedup.stream.metrics import Metrics

__all__ = ["Gauges"]


class Gauges:
    """Sets the gauges of :class:`Metrics` and remembers which label children it created."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._shards: set[int] = set()
        self._lagged: set[tuple[str, str]] = set()

    def update_shards(self, shards: Mapping[int, Any]) -> None:
        """``shards``: partition -> shard (``len()`` is its fingerprints, ``.nbytes`` its memory,
        ``.file_bytes`` its row files)."""
        m = self.metrics
        for p, shard in shards.items():
            m.shard_fingerprints.labels(str(p)).set(len(shard))
            m.shard_bytes.labels(str(p)).set(shard.nbytes)
            m.shard_file_bytes.labels(str(p)).set(shard.file_bytes)
        for p in self._shards - set(shards):  # moved to another worker: stop reporting it here
            m.shard_fingerprints.remove(str(p))
            m.shard_bytes.remove(str(p))
            m.shard_file_bytes.remove(str(p))
        self._shards = set(shards)

    def update_lag(self, consumer: Any, watched: set[str], pages_topic: str, committed: Mapping[int, int]) -> None:
        """Lag of the watched topics' assigned partitions; for the pages topic, records not yet
        committed (``committed``: partition -> next offset), else records not yet read."""
        try:
            assigned = consumer.assignment()
        except Exception:  # not started yet
            return
        lags = {}
        for tp in assigned:
            if tp.topic not in watched or (hw := consumer.highwater(tp)) is None:
                continue
            if tp.topic == pages_topic and tp.partition in committed:
                done = committed[tp.partition]  # judged and committed
            else:
                read = consumer._read_offset.get(tp)  # faust's consumer keeps it privately
                done = read + 1 if read is not None else hw
            lags[tp.topic, str(tp.partition)] = max(0, hw - done)
        for key in self._lagged - set(lags):
            self.metrics.consumer_lag.remove(*key)
        for key, lag in lags.items():
            self.metrics.consumer_lag.labels(*key).set(lag)
        self._lagged = set(lags)

    def update_recovery(self, recovery: Any) -> None:
        """Changelog records faust's recovery still has to replay."""
        remaining = 0
        if recovery.in_recovery:
            remaining = sum(
                max(0, hw - (recovery.active_offsets.get(tp) or 0)) for tp, hw in recovery.active_highwaters.items()
            )
        self.metrics.recovery_target.set(remaining)
