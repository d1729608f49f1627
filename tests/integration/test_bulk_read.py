"""The bulk changelog reader (:func:`streamdedup.stream.connection.read_ranges`) on the real broker.

It reads in a thread of its own, a fetch ahead of its caller (docs/faust-notes.md §14).  These
pin what that must not change: each partition's committed records in offset order, whatever
the read-ahead; an error reaches the caller after the runs before it; closing the read (the
caller stops, or its deadline runs out) stops the thread and its consumer; and through the
store, a replay restores every row, or stops between runs when the group asks the worker to
rejoin, with the offsets of what it restored.

Fetch sizes are made tiny here so that a few hundred records come in many runs.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from faust.types import TP
from kafka_broker import unique_name
from prometheus_client import CollectorRegistry
from store_rebalance import assign

from streamdedup.pipeline.wire import CHANGELOG, Batch, encode
from streamdedup.settings import Settings
from streamdedup.stream import connection
from streamdedup.stream.app import Worker
from streamdedup.stream.connection import read_ranges
from streamdedup.stream.store import BulkReplay, ShardStore

pytestmark = pytest.mark.kafka

ROWS = 5  # rows a changelog record


def _value(n: int) -> bytes:
    ids = [f"r{n}-{i}" for i in range(ROWS)]
    batch = Batch.build(group=[i % 4 for i in range(ROWS)], fps=np.arange(ROWS) + 1000 * n, fetched=[0] * ROWS,
                        id_hash=list(range(ROWS)), ids=ids, urls=ids)  # fmt: skip
    return encode(batch, CHANGELOG)


@pytest.fixture
def small_fetches(monkeypatch):
    """A fetch of a few records: many runs from a small topic."""
    monkeypatch.setattr(connection, "BULK_FETCH_MAX_BYTES", 4096)
    monkeypatch.setattr(connection, "BULK_PARTITION_FETCH_BYTES", 2048)


def _settings(kafka, **kw: Any) -> Settings:
    return Settings(brokers=(kafka.bootstrap,), app_id=unique_name("bulkread"), fingerprint_processes=0, **kw)


async def _write(kafka, topic: str, per_partition: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """``n`` committed records into each partition, with an aborted transaction in the middle
    (its records and both markers take offsets); the committed (offset, value)s of each."""
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in per_partition}
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=unique_name("tx"))
    await producer.start()
    try:
        for p, n in per_partition.items():
            for half in (range(n // 2), range(n // 2, n)):
                async with producer.transaction():
                    for i in half:
                        value = _value(1000 * p + i)
                        meta = await (await producer.send(topic, value, key=b"k%d" % i, partition=p))
                        out[p].append((meta.offset, value))
                await producer.begin_transaction()
                await (await producer.send(topic, b"aborted", partition=p))
                await producer.abort_transaction()
    finally:
        await producer.stop()
    return out


async def _end_offsets(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    return await connection.end_offsets(settings, topic, partitions)


def _readers(topic: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"bulk-replay-{topic}" and t.is_alive()]


async def _no_reader_left(topic: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while _readers(topic):
        assert time.monotonic() < deadline, "the bulk reader's thread is still running"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_each_partition_comes_in_offset_order_whatever_the_read_ahead(kafka, small_fetches, ahead):
    topic = kafka.create_topic(unique_name("changelog"), partitions=2)
    settings = _settings(kafka)

    async def scenario() -> None:
        written = await _write(kafka, topic, {0: 60, 1: 40})
        ends = await _end_offsets(settings, topic, [0, 1])
        start1 = written[1][7][0]  # partition 1 from its 8th record
        got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        done: list[int] = []
        runs = 0
        async for p, run in read_ranges(settings, topic, {0: (0, ends[0]), 1: (start1, ends[1])}, ahead=ahead):
            assert p not in done, "records of a partition after its end"
            if not run:
                done.append(p)
            got[p] += [(r.offset, r.value) for r in run]
            runs += 1
        assert sorted(done) == [0, 1]
        assert got[0] == written[0] and got[1] == written[1][7:]  # no aborted record, none twice, in order
        assert runs > 10  # (the small fetches made many runs)
        await _no_reader_left(topic)

    asyncio.run(scenario())


def test_an_error_of_the_reader_reaches_the_caller_after_the_runs_before_it(kafka, small_fetches, monkeypatch):
    topic = kafka.create_topic(unique_name("changelog"), partitions=1)
    settings = _settings(kafka)
    getmany, fetches = connection.AIOKafkaConsumer.getmany, []

    async def failing(self, *tps, **kw):
        if len(fetches) >= 3:  # after three fetches with records
            raise KafkaConnectionError("the broker went away")
        fetched = await getmany(self, *tps, **kw)
        if fetched:
            fetches.append(fetched)
        return fetched

    monkeypatch.setattr(connection.AIOKafkaConsumer, "getmany", failing)

    async def scenario() -> None:
        written = await _write(kafka, topic, {0: 200})
        ends = await _end_offsets(settings, topic, [0])
        got: list[int] = []
        with pytest.raises(KafkaConnectionError, match="the broker went away"):
            async for _, run in read_ranges(settings, topic, {0: (0, ends[0])}, ahead=2):
                got += [r.offset for r in run]
        assert got and got == [o for o, _ in written[0]][: len(got)]  # what came first, in order
        await _no_reader_left(topic)

    asyncio.run(scenario())


def test_closing_the_read_or_its_deadline_stops_the_thread(kafka, small_fetches, monkeypatch):
    topic = kafka.create_topic(unique_name("changelog"), partitions=1)
    settings = _settings(kafka)

    async def scenario() -> None:
        written = await _write(kafka, topic, {0: 200})
        ends = await _end_offsets(settings, topic, [0])
        # the caller stops after its first run, while the thread has read ahead
        reader = read_ranges(settings, topic, {0: (0, ends[0])}, ahead=2)
        _, run = await anext(reader)
        assert [r.offset for r in run] == [o for o, _ in written[0]][: len(run)]
        await asyncio.wait_for(reader.aclose(), 15)
        await _no_reader_left(topic)
        # the caller's deadline runs out while the thread waits for a fetch that does not come
        getmany = connection.AIOKafkaConsumer.getmany

        async def stuck(self, *tps, **kw):
            await asyncio.sleep(3600)
            return await getmany(self, *tps, **kw)

        monkeypatch.setattr(connection.AIOKafkaConsumer, "getmany", stuck)
        reader = read_ranges(settings, topic, {0: (0, ends[0])}, ahead=1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2):
                async for _ in reader:
                    pass
        await asyncio.wait_for(reader.aclose(), 15)
        await _no_reader_left(topic)

    asyncio.run(scenario())


# -------------------------------------------------------------- through the store


@pytest.fixture
def worker(kafka, tmp_path, monkeypatch, small_fetches):
    settings = _settings(kafka, data_dir=tmp_path, partitions=2)
    w = Worker(settings, registry=CollectorRegistry())
    kafka.create_topic(w.store._changelog(), partitions=2)
    yield w
    w.close()


@pytest.mark.parametrize("rejoin_after", [None, 3])
def test_a_store_replays_through_the_read_ahead_in_order_and_stops_between_runs_at_a_rebalance(
    kafka, worker, monkeypatch, rejoin_after
):
    store, topic, settings = worker.store, worker.store._changelog(), worker.settings
    rejoin, restored = asyncio.Event(), []
    real_apply = ShardStore._apply

    def apply(self, run) -> None:  # what the store restores, in its order
        restored.append((run.partition, [m.offset for m in run.messages]))
        real_apply(self, run)

    @asynccontextmanager
    async def keepalive(app: Any) -> AsyncIterator[asyncio.Event]:
        yield rejoin

    async def after_each_run() -> None:  # the heartbeats' answer: another member joined
        if rejoin_after is not None and len(restored) >= rejoin_after:
            rejoin.set()

    read = functools.partial(read_ranges, settings)
    monkeypatch.setattr(ShardStore, "_apply", apply)
    monkeypatch.setattr(ShardStore, "bulk", BulkReplay(read, min_records=0, keepalive=keepalive, check=after_each_run))

    async def scenario() -> dict[int, list[tuple[int, bytes]]]:
        written = await _write(kafka, topic, {0: 80, 1: 50})
        await assign(worker, monkeypatch, {0, 1})
        await _no_reader_left(topic)
        return written

    written = asyncio.run(scenario())
    for p in (0, 1):
        offsets = [o for q, run in restored if q == p for o in run]
        assert offsets == [o for o, _ in written[p]][: len(offsets)]  # in order, from the start, none twice
    if rejoin_after is None:
        ends = asyncio.run(_end_offsets(settings, topic, [0, 1]))
        assert {p: len(store.shards[p]) for p in (0, 1)} == {0: 80 * ROWS, 1: 50 * ROWS}
        assert {p: store.offsets[p] for p in (0, 1)} == {p: ends[p] - 1 for p in (0, 1)}  # (markers up to the end)
    else:
        assert len(restored) == rejoin_after  # stopped at the run after which the group asked
        for p in (0, 1):
            offsets = [o for q, run in restored if q == p for o in run]
            assert store.offsets.get(p) == (offsets[-1] if offsets else None)
            assert (len(store.shards[p]) if p in store.shards else 0) == len(offsets) * ROWS
        # faust's recovery replays the rest from there (as in tests/test_bulk_replay_store.py)
        for p in (0, 1):
            start = store.persisted_offset(TP(topic, p))
            rest = [(o, v) for o, v in written[p] if o > (-1 if start is None else start)]
            events = [
                SimpleNamespace(message=SimpleNamespace(partition=p, offset=o, key=b"k", value=v)) for o, v in rest
            ]
            store.apply_changelog_batch(events, None, None)
        assert {p: len(store.shards[p]) for p in (0, 1)} == {0: 80 * ROWS, 1: 50 * ROWS}


def test_offsets_read_by_a_client_of_our_own(kafka):
    """The end and first offsets recovery and the assignment's seek read outside faust's consumer
    (connection.list_offsets), and the group's start where it has no commit (committed_offsets):
    a partition whose first records were deleted starts after them."""
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.errors import GroupCoordinatorNotAvailableError
    from aiokafka.structs import TopicPartition

    topic = kafka.create_topic(unique_name("offsets"), partitions=2)
    settings = _settings(kafka)
    tps = [(topic, 0), (topic, 1)]

    async def scenario() -> tuple:
        written = await _write(kafka, topic, {0: 6})
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=2)})
        finally:
            await admin.close()
        ends = await connection.list_offsets(settings, tps, latest=True)
        firsts = await connection.list_offsets(settings, tps, latest=False)
        deadline = time.monotonic() + 30
        while True:  # (a fresh broker creates its offsets topic on the first group request)
            try:
                starts = await connection.committed_offsets(settings, topic, [0, 1])
                break
            except GroupCoordinatorNotAvailableError:
                assert time.monotonic() < deadline, "no group coordinator after 30 s"
                await asyncio.sleep(0.5)
        return written, ends, firsts, starts

    written, ends, firsts, starts = asyncio.run(scenario())
    assert ends[(topic, 0)] > written[0][-1][0] and ends[(topic, 1)] == 0  # (past the last marker)
    assert firsts == {(topic, 0): 2, (topic, 1): 0}
    assert starts == {0: 2, 1: 0}  # no commit: the partition's first record
    assert asyncio.run(connection.list_offsets(settings, [], latest=True)) == {}
