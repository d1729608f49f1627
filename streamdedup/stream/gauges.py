"""The worker's gauges, refreshed every 5 s: shard sizes, consumer lag, recovery progress.

Series of partitions that moved to another worker are removed, so a dashboard never sums a
shard twice or shows a frozen lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import Worker

__all__ = ["update_gauges"]


def update_gauges(worker: "Worker") -> None:
    m = worker.metrics
    shards = dict(worker.store.shards)
    for p, shard in shards.items():
        m.shard_fingerprints.labels(str(p)).set(len(shard))
        m.shard_bytes.labels(str(p)).set(shard.nbytes)
    for p in worker._gauged - set(shards):  # moved to another worker: stop reporting it here
        m.shard_fingerprints.remove(str(p))
        m.shard_bytes.remove(str(p))
    worker._gauged = set(shards)
    try:
        assigned = worker.app.consumer.assignment()
    except Exception:  # not started yet
        return
    watched = {worker.settings.pages_topic, worker.probes_topic.get_topic_name(), worker.answers_topic.get_topic_name()}
    lags = {}
    for tp in assigned:
        if tp.topic not in watched or (hw := worker.app.consumer.highwater(tp)) is None:
            continue
        if tp.topic == worker.settings.pages_topic and tp.partition in worker.outbox.committed:
            done = worker.outbox.committed[tp.partition]  # judged and committed
        else:
            read = worker.app.consumer._read_offset.get(tp)
            done = read + 1 if read is not None else hw
        lags[tp.topic, str(tp.partition)] = max(0, hw - done)
    for key in worker._lagged - set(lags):
        m.consumer_lag.remove(*key)
    for key, lag in lags.items():
        m.consumer_lag.labels(*key).set(lag)
    worker._lagged = set(lags)
    recovery = worker.app.tables.recovery
    remaining = 0
    if recovery.in_recovery:
        remaining = sum(max(0, hw - (recovery.active_offsets.get(tp) or 0))
                        for tp, hw in recovery.active_highwaters.items())
    m.recovery_target.set(remaining)
