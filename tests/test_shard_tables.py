"""The worker's table manager (stream/recovery.py): faust's, without the 1 s sleep before its
tables are registered (the consumer subscribes, and so every start joins the group, only then)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from faust.tables.manager import TableManager
from faust.types import TP
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream.app import Worker
from streamdedup.stream.recovery import ShardRecovery, ShardTables


def registered_after(manager_class: type[TableManager], tmp_path) -> float:
    """Seconds from the manager's on_start until its tables are registered (the registration and
    the recovery's start stubbed: they need a broker)."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    manager = manager_class(w.app)
    for table in w.app.tables.values():
        manager.add(table)

    async def register() -> None:
        manager._tables_registered.set()

    async def no_recovery() -> None:
        pass

    manager._update_channels = register  # type: ignore[method-assign]
    manager.recovery.start = no_recovery  # type: ignore[method-assign]

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.wait_for(manager.on_start(), 5)
        assert manager._tables_registered.is_set()
        return time.perf_counter() - t0

    return asyncio.run(run())


def test_the_worker_app_uses_the_shard_tables(tmp_path):
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    assert isinstance(w.app.tables, ShardTables)
    assert isinstance(w.app.tables.recovery, ShardRecovery)
    assert w.app.tables.recovery.read is not None  # its offsets read by a client of our own
    assert "shards" in w.app.tables


def test_tables_are_registered_without_fausts_second_of_sleep(tmp_path):
    assert registered_after(TableManager, tmp_path / "faust") >= 1.0  # (what is left out)
    assert registered_after(ShardTables, tmp_path / "ours") < 0.5


class FaustConsumer:
    """What faust's recovery asks of its consumer for offsets (faust's consumer needs a broker)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def highwaters(self, *tps):
        self.asked.append("highwaters")
        return {tp: 7 for tp in tps}

    async def earliest_offsets(self, *tps):
        self.asked.append("earliest")
        return {tp: 2 for tp in tps}


def build_offsets(tmp_path, read) -> tuple[dict, dict, list[str]]:
    """faust's recovery's highwaters and start offsets of two changelog partitions, its offsets
    read by ``read``; -> (highwaters, start offsets, what faust's consumer was asked)."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    manager = ShardTables.using(read)(w.app)
    recovery, consumer = manager.recovery, FaustConsumer()
    tps = {TP("c", 0), TP("c", 1)}
    high: Counter = Counter()
    starts: Counter = Counter({TP("c", 1): 4})  # partition 1: a snapshot up to offset 4

    async def run() -> None:
        await recovery._build_highwaters(consumer, tps, high, "active")
        await recovery._build_offsets(consumer, tps, starts, "active")

    asyncio.run(run())
    return dict(high), dict(starts), consumer.asked


def test_recovery_reads_the_changelog_offsets_by_a_client_of_its_own(tmp_path):
    asked: list[tuple] = []

    async def read(tps, *, latest):
        asked.append((sorted(tps), latest))
        return {tp: (10 + tp[1] if latest else 3) for tp in tps}

    high, starts, faust_asked = build_offsets(tmp_path, read)
    assert faust_asked == []  # nothing went through faust's consumer (behind its fetch)
    assert asked == [([("c", 0), ("c", 1)], True), ([("c", 0), ("c", 1)], False)]
    # faust's own arithmetic on them: highwater = end - 1, start = max(known, first - 1)
    assert high == {TP("c", 0): 9, TP("c", 1): 10}
    assert starts == {TP("c", 0): 2, TP("c", 1): 4}


def test_recovery_falls_back_to_fausts_consumer_if_its_own_read_fails(tmp_path):
    async def read(tps, *, latest):
        raise ConnectionError("no broker")

    high, starts, faust_asked = build_offsets(tmp_path, read)
    assert faust_asked == ["highwaters", "earliest"]
    assert high == {TP("c", 0): 6, TP("c", 1): 6}
    assert starts == {TP("c", 0): 1, TP("c", 1): 4}


def test_the_recovery_logs_as_fausts(tmp_path):
    """Operators and tools grep faust's recovery lines ("[^---Recovery]: Worker ready")."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    assert w.app.tables.recovery.shortlabel == "Recovery"


def test_the_worker_consumers_fetch_waits_100_ms_not_fausts_1500(tmp_path):
    """A fetch sent without the pages partitions paused or buffered at that moment holds their
    next records until it returns; with the worker's probes given to its own shards
    (--local-shards) no other topic's traffic ends it sooner (bench/README.md, "Shards here")."""
    from streamdedup.stream.app import FETCH_MAX_WAIT_MS

    async def consumer_fetch_wait() -> int:
        w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
        consumer = w.app.consumer._thread._create_worker_consumer(w.app.transport)  # (as the consumer thread does)
        w.close()
        return consumer._fetch_max_wait_ms

    assert FETCH_MAX_WAIT_MS == 100
    assert asyncio.run(consumer_fetch_wait()) == FETCH_MAX_WAIT_MS
