"""The pages stage across a rebalance, without a broker: a Worker whose Kafka sends are stubbed.

These pin the cause of the records lost after a SIGKILL under load (docs/faust-notes.md §8): a
pages batch taken before a revocation ran its duplicate check after it, so the next assignment
believed it had already taken offsets it never judged, and skipped them when faust read the
partition again from the committed offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream import app as app_module
from streamdedup.stream import pool as pool_module
from streamdedup.stream.app import Worker, _size


@dataclass
class Message:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list = field(default_factory=list)
    timestamp: float = 1_700_000_000.0


@dataclass
class Event:
    message: Message


def events(partition: int, offsets: range) -> list[Event]:
    out = []
    for o in offsets:
        page = {"url": f"http://r.test/{partition}/{o}", "content": f"<p>page {o} " + "words here " * 30 + "</p>"}
        out.append(Event(Message(partition, o, page["url"].encode(), json.dumps(page).encode())))
    return out


class Topic:
    def __init__(self) -> None:
        self.sent: list[int] = []

    async def send(self, value: bytes, partition: int) -> None:
        self.sent.append(partition)

    def get_topic_name(self) -> str:
        return "probes"


def stubbed(tmp_path, processes: int = 0) -> Worker:
    """A Worker of 2 partitions with no Kafka: probes are counted, flushes never run."""
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=processes, partitions=2), registry=CollectorRegistry())
    w.probes_topic = Topic()
    w.outbox.schedule = lambda partition: None
    w.outbox.owned = {0, 1}
    return w


@pytest.fixture
def worker(tmp_path):
    w = stubbed(tmp_path)
    yield w
    w.close()


def waiting_offsets(w: Worker, partition: int) -> list[int]:
    return sorted(w.pending._parts.get(partition, {}))


def test_a_batch_taken_before_a_revocation_is_dropped_and_the_next_assignment_takes_every_record(worker):
    async def scenario() -> None:
        pages = worker.settings.pages_topic
        await worker.drain(events(0, range(100, 114)))
        assert waiting_offsets(worker, 0) == list(range(100, 114))
        # a batch further on is handed to a task, and the partition is revoked before it runs
        task = asyncio.get_running_loop().create_task(worker.drain(events(0, range(154, 194)), worker._generation))
        await worker.app.on_partitions_revoked.send({TP(pages, 0), TP(pages, 1)})
        await task
        assert waiting_offsets(worker, 0) == []  # nothing of the old assignment is left
        # the partition comes back: faust reads it again from the committed offset (100)
        worker.outbox.owned = {0, 1}
        await worker.drain(events(0, range(100, 194)))
        assert waiting_offsets(worker, 0) == list(range(100, 194))  # none skipped

    asyncio.run(scenario())


def test_records_delivered_twice_are_taken_once_and_a_hole_is_filled(worker):
    async def scenario() -> None:
        await worker.drain(events(1, range(120, 130)))  # delivered before recovery's seek
        await worker.drain(events(1, range(110, 135)))  # again from the committed offset, and on
        assert waiting_offsets(worker, 1) == list(range(110, 135))
        assert worker.metrics.pages._value.get() == 25  # each record counted (taken) once

    asyncio.run(scenario())


@dataclass
class Read:  # a record as the outbox's own consumer returns it (aiokafka's ConsumerRecord)
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple = ()
    timestamp: int = 1_700_000_000_000


def reader(partition: int, have: set[int], fail: bool = False, gate: asyncio.Event | None = None, per_read: int = 0):
    """A stand-in for Outbox.read_range on a partition holding records at ``have`` (that waits
    for ``gate`` if given; returns at most ``per_read`` records, not reaching the end, if given)."""
    reads: list[tuple[int, int, int]] = []

    async def read_range(p: int, first: int, last: int, timeout: float = 10.0):
        reads.append((p, first, last))
        if gate is not None:
            await gate.wait()
        if fail:
            raise OSError("broker unreachable")
        found = [Read(e.message.partition, e.message.offset, e.message.key, e.message.value)
                 for e in events(partition, range(first, last + 1)) if e.message.offset in have]  # fmt: skip
        return (found[:per_read], False) if per_read else (found, True)

    return read_range, reads


async def until(condition, what: str, timeout: float = 10.0, worker: Worker | None = None) -> None:
    """Poll ``condition``; with ``worker``, also do the batch timer's part (a partial batch, such
    as the records held behind a hole once it is filled, is taken within batch_timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not in {timeout} s: {what}"
        await asyncio.sleep(0.01)
        if worker is not None and worker._buffer:
            worker._kick(partial=True)


@pytest.fixture
def assigned(worker, monkeypatch):
    monkeypatch.setattr(app_module, "HOLE_RECHECK_SECONDS", 0.0)
    worker.outbox.assign({0, 1})
    worker.outbox.start(0, 100)
    worker.outbox.start(1, 0)
    return worker


def batch_sizes(worker: Worker, monkeypatch) -> list[int]:
    """The sizes of the batches the worker takes from now on, in order."""
    sizes: list[int] = []
    drain = worker.drain

    async def counted(events, generation=None):
        sizes.append(len(events))
        return await drain(events, generation)

    monkeypatch.setattr(worker, "drain", counted)
    return sizes


def deliver(worker: Worker, partition: int, offsets) -> None:
    for e in events(partition, offsets):
        worker._deliver(e)  # what the pages agent does with each event
    worker._kick(partial=True)  # (the batch timer's part)


def test_the_first_record_after_an_assignment_beyond_the_committed_offset_is_read_and_judged(assigned):
    """Recovery's seek, raced by a stale fetch, can leave out the first records of an assignment
    (docs/faust-notes.md §10): the old hole check started with the first record delivered, and
    the outbox committed past 100 and 101."""
    worker = assigned
    worker.outbox.read_range, reads = reader(0, set(range(100, 110)))

    async def scenario() -> None:
        deliver(worker, 0, range(102, 110))
        await until(lambda: waiting_offsets(worker, 0) == list(range(100, 110)), "100 and 101 judged", worker=worker)
        assert reads == [(0, 100, 101)]  # up to the last offset missing
        assert worker.outbox.tracker(0).hole() is None
        assert worker.outbox.tracker(0).committable(waiting_offsets(worker, 0)) == 10

    asyncio.run(scenario())


def test_a_record_skipped_between_two_delivered_ones_is_read_and_judged(assigned):
    worker = assigned
    worker.outbox.read_range, reads = reader(1, set(range(0, 10)))

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 2, 4, 5])
        await until(lambda: waiting_offsets(worker, 1) == [0, 1, 2, 3, 4, 5], "3 judged", worker=worker)
        assert reads == [(1, 3, 3)]
        deliver(worker, 1, [3, 4, 5, 6])  # faust's own re-read, late: duplicates are dropped
        await until(lambda: waiting_offsets(worker, 1) == list(range(7)), "6 judged", worker=worker)
        assert worker.metrics.pages._value.get() == 7  # each record taken once
        assert reads == [(1, 3, 3)]

    asyncio.run(scenario())


def test_an_offset_a_read_shows_to_hold_no_record_is_skipped(assigned, caplog):
    worker = assigned
    worker.outbox.read_range, reads = reader(1, {0, 1, 3, 4})  # 2 is a transaction marker

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 3, 4])
        await until(lambda: worker.outbox.tracker(1).hole() is None, "the hole checked")
        assert reads == [(1, 2, 2)]
        assert worker.outbox.tracker(1).committable([0, 1, 3, 4]) == 4
        assert worker.metrics.offsets_skipped.labels("empty")._value.get() == 1

    with caplog.at_level("INFO", logger="streamdedup.worker"):
        asyncio.run(scenario())
    assert "offsets 2 hold no record" in caplog.text


def test_a_hole_that_cannot_be_read_is_given_up_after_bounded_retries(assigned, caplog, monkeypatch):
    worker = assigned
    monkeypatch.setattr(app_module, "HOLE_ERRORS_SECONDS", 0.0)  # (the reads fail at once: errors)
    worker.outbox.read_range, reads = reader(1, set(), fail=True)

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 5])
        await until(lambda: worker.outbox.tracker(1).hole() is None, "the hole given up")
        assert reads == [(1, 2, 4)] * app_module.HOLE_READS
        assert worker.outbox.tracker(1).committable([0, 1, 5]) == 3
        assert worker.metrics.offsets_skipped.labels("unread")._value.get() == 3

    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("partition 1: offsets 2-4 were not delivered and could not be read" in m for m in warnings)


def test_a_hole_whose_reads_fail_for_a_short_while_is_read_once_the_broker_is_back(assigned):
    """A broker away for a few seconds while a hole was open: its reads failed at once, and after
    HOLE_READS of them the worker committed past the hole's records without an outcome."""
    worker = assigned
    failing, reads = reader(1, set(), fail=True)
    working, _ = reader(1, set(range(10)))

    async def read_range(p: int, first: int, last: int, timeout: float = 10.0):
        if len(reads) < 2 * app_module.HOLE_READS:  # the broker comes back after twice that many
            return await failing(p, first, last, timeout)
        return await working(p, first, last, timeout)

    worker.outbox.read_range = read_range

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 5])
        await until(lambda: waiting_offsets(worker, 1) == [0, 1, 2, 3, 4, 5], "the hole read", worker=worker)
        assert worker.metrics.offsets_skipped.labels("unread")._value.get() == 0

    asyncio.run(scenario())


def test_reads_that_make_progress_are_not_counted_as_failures(assigned):
    worker = assigned
    worker.outbox.read_range, reads = reader(1, set(range(10)), per_read=1)  # one record a read (a slow read)

    async def scenario() -> None:
        deliver(worker, 1, [0, 9])
        await until(lambda: waiting_offsets(worker, 1) == list(range(10)), "1-8 judged", worker=worker)
        assert [first for _, first, _ in reads] == list(range(1, 9))  # 8 reads, none given up
        assert worker.metrics.offsets_skipped.labels("unread")._value.get() == 0

    asyncio.run(scenario())


def test_a_hole_is_filled_even_when_back_pressure_stops_new_batches(assigned):
    """The pages waiting fill up to the back-pressure limit (partition 0's): the records read into
    partition 1's hole are judged all the same, and its records after the hole wait for it."""
    worker = assigned
    limit = worker._max_waiting

    async def scenario() -> None:
        gate = asyncio.Event()
        worker.outbox.read_range, reads = reader(1, set(range(limit)), gate=gate)
        deliver(worker, 0, range(100, 100 + 2 * limit))
        await until(lambda: len(worker.pending) >= limit and not worker._in_flight, "the backlog full", worker=worker)
        deliver(worker, 1, range(1, 50))
        assert worker._buffer and not waiting_offsets(worker, 1)  # no new batch starts now
        gate.set()  # the hole's read returns
        await until(lambda: 0 in waiting_offsets(worker, 1), "0 judged")
        assert waiting_offsets(worker, 1) == [0]  # (the rest still held back: only the hole was judged)
        assert worker.outbox.tracker(1).committable(waiting_offsets(worker, 1)) == 1

    asyncio.run(scenario())


def registration_order(worker: Worker) -> list[tuple[int, int]]:
    """(partition, offset) of each page as the worker registers it (the order its probes go
    out in, so the order the shards store the pages in)."""
    order: list[tuple[int, int]] = []
    add_page = worker.pending.add_page

    def registered(partition: int, offset: int, **kwargs):
        order.append((partition, offset))
        return add_page(partition, offset, **kwargs)

    worker.pending.add_page = registered  # type: ignore[method-assign]
    return order


def test_records_after_a_hole_wait_for_it_and_are_judged_in_offset_order(assigned):
    """A page is stored where its offset puts it, also when the consumer skipped a record before
    it (the order rule: with one partition the verdicts are scan's on the partition's order)."""
    worker = assigned
    worker.outbox.read_range, reads = reader(1, set(range(10)))
    order = registration_order(worker)

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 2, 4, 5])
        await until(lambda: waiting_offsets(worker, 1) == [0, 1, 2, 3, 4, 5], "3, 4 and 5 judged", worker=worker)
        assert order == [(1, o) for o in range(6)]

    asyncio.run(scenario())


def test_records_before_a_hole_held_by_back_pressure_are_judged_before_its_fillers(assigned):
    """The records read into a hole are judged whatever the back-pressure (they hold the commits
    back); the records of their partition before the hole, held in the buffer by that
    back-pressure, were judged after them: pages stored out of offset order."""
    worker = assigned
    limit = worker._max_waiting
    order = registration_order(worker)

    async def scenario() -> None:
        gate = asyncio.Event()
        worker.outbox.read_range, _ = reader(1, {3, 4}, gate=gate)
        deliver(worker, 0, range(100, 100 + limit))
        await until(lambda: len(worker.pending) >= limit and not worker._in_flight, "the backlog full", worker=worker)
        deliver(worker, 1, [0, 1, 2, 5, 6])  # 3 and 4 skipped by the consumer: a hole
        gate.set()
        await until(lambda: 4 in waiting_offsets(worker, 1), "the hole judged")
        worker.pending.drop(0)  # the backlog's answers came and it was committed
        await until(lambda: waiting_offsets(worker, 1) == list(range(7)), "all judged", worker=worker)
        assert [o for p, o in order if p == 1] == list(range(7))

    asyncio.run(scenario())


def test_records_read_into_a_hole_in_another_order_are_judged_in_offset_order(assigned):
    """faust delivers a record of a hole late (4) while the worker's own read brings the one
    before it (3): with no hole left, the fillers were taken as they came, 4 before 3."""
    worker = assigned
    order = registration_order(worker)

    async def scenario() -> None:
        gate = asyncio.Event()
        worker.outbox.read_range, reads = reader(1, {3}, gate=gate)
        deliver(worker, 1, [0, 1, 2, 5])
        await until(lambda: reads, "the hole's read")
        deliver(worker, 1, [4])  # faust's late delivery of part of the hole
        gate.set()
        await until(lambda: waiting_offsets(worker, 1) == list(range(6)), "all judged", worker=worker)
        assert [o for p, o in order if p == 1] == list(range(6))

    asyncio.run(scenario())


def test_records_delivered_before_the_committed_offset_is_known_wait_for_it(worker, monkeypatch):
    """faust hands out records of a new assignment before the worker has read where its commits
    start: a record it skipped among them shows as a hole only then, and the records after it
    must not be judged before it."""
    monkeypatch.setattr(app_module, "HOLE_RECHECK_SECONDS", 0.0)
    worker.outbox.assign({0, 1})
    worker.outbox.read_range, reads = reader(1, set(range(10)))
    order: list[int] = []
    add_page = worker.pending.add_page

    def registered(partition: int, offset: int, **kwargs):
        order.append(offset)
        return add_page(partition, offset, **kwargs)

    worker.pending.add_page = registered  # type: ignore[method-assign]

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 3, 4])  # 2 skipped, and the committed offset not known yet
        await asyncio.sleep(0.05)
        assert order == []  # held
        worker.outbox.start(1, 0)  # what _seek_uncommitted does once it is read
        worker._watch_holes(1)
        worker._kick(partial=True)
        await until(lambda: waiting_offsets(worker, 1) == list(range(5)), "2 read and all judged", worker=worker)
        assert order == list(range(5))
        assert reads == [(1, 2, 2)]

    asyncio.run(scenario())


@pytest.mark.parametrize("seconds, heartbeat", [(10, 3.0), (6, 2.0), (60, 3.0)])
def test_session_timeout_sets_how_soon_the_group_expires_a_dead_worker(tmp_path, seconds, heartbeat):
    """--session-timeout reaches faust's consumer, with a heartbeat of at most a third of it."""
    s = Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2, session_timeout=seconds)
    w = Worker(s, registry=CollectorRegistry())
    try:
        assert w.app.conf.broker_session_timeout == seconds
        assert w.app.conf.broker_heartbeat_interval == heartbeat
    finally:
        w.close()


def test_a_pages_partition_that_delivers_nothing_while_records_wait_is_sought_again(assigned, monkeypatch):
    """faust's consumer can leave a partition unfetched after an assignment (docs/faust-notes.md
    §9): a partition silent for PARTITION_SILENCE with records past the last one delivered is
    sought again, from the first offset not delivered; a quiet one with nothing waiting is not."""
    worker = assigned
    sought: list[tuple[int, int]] = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.partition, offset))

    async def ends(partitions: list[int]) -> dict[int, int]:
        return {0: 130, 1: 0}  # partition 0: records 100..129 wait; partition 1 holds none

    monkeypatch.setattr(worker, "_seek", seek)
    monkeypatch.setattr(worker, "_ends", lambda topic, partitions: ends(partitions))
    recovery = SimpleNamespace(completed=SimpleNamespace(is_set=lambda: True))
    monkeypatch.setattr(worker.app, "tables", SimpleNamespace(recovery=recovery))
    worker._heard_pages = {0: 0.0, 1: 0.0}

    async def scenario() -> None:
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE / 2) == []  # not silent long enough
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE) == [(worker.settings.pages_topic, 0)]
        assert sought == [(0, 100)]
        # sought: it gets another PARTITION_SILENCE before the next try
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE + 1) == []
        worker._paused = True  # the worker's own back-pressure: silence is expected
        assert await worker.reseek_stalled(now=3 * app_module.PARTITION_SILENCE) == []

    asyncio.run(scenario())


def test_a_probes_or_answers_partition_left_behind_is_sought_again_from_the_first_offset_not_taken(
    assigned, monkeypatch, caplog
):
    """The backstop covers every topic the worker consumes (docs/faust-notes.md §9): an owned
    probes or answers partition silent for PARTITION_SILENCE with records past the next offset its
    stage would take is sought there (the group's committed offset if the stage took nothing in
    this assignment), with a WARNING; not while its stage is in a batch, nor with nothing waiting."""
    worker = assigned
    probes, answers = worker.probes_topic.get_topic_name(), worker.answers_topic.get_topic_name()
    worker._assigned = {TP(probes, 0), TP(probes, 1), TP(answers, 0), TP(answers, 1)}
    worker._heard_internal = {(probes, 0): 0.0, (probes, 1): 0.0, (answers, 0): 0.0, (answers, 1): 0.0}
    sought: list[tuple[str, int, int]] = []
    asked: list[tuple[str, list[int]]] = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.topic, tp.partition, offset))

    ends_now = {probes: {0: 40, 1: 7}, answers: {0: 12, 1: 3}}

    async def ends(topic: str, partitions: list[int]) -> dict[int, int]:
        return ends_now[topic]

    async def starts(topic: str, partitions: list[int]) -> dict[int, int]:  # the group's committed offsets
        asked.append((topic, partitions))
        return {p: 5 for p in partitions}

    monkeypatch.setattr(worker, "_seek", seek)
    monkeypatch.setattr(worker, "_ends", ends)
    monkeypatch.setattr(worker, "_starts", starts)
    recovery = SimpleNamespace(completed=SimpleNamespace(is_set=lambda: True))
    monkeypatch.setattr(worker.app, "tables", SimpleNamespace(recovery=recovery))
    # the shard stage took probes 0's offsets up to 29 and answers 1's up to 2; nothing else yet
    worker._heard_from(probes, [Event(Message(0, o, b"", b"")) for o in range(20, 30)])
    worker._heard_from(answers, [Event(Message(1, 2, b"", b""))])
    worker._heard_internal = {k: 0.0 for k in worker._heard_internal}  # ... long ago
    worker._internal_start = {(answers, 0): 5}  # where the assignment began reading (_seek_uncommitted)

    async def scenario() -> None:
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE / 2) == []  # not silent long enough
        worker._busy.add("shard")  # the shard stage is in a batch: its records wait for it, not for the consumer
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE) == [(answers, 0)]
        assert sought == [(answers, 0, 5)]  # nothing taken there: from where the assignment began
        worker._busy.clear()
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE + 1) == [(probes, 0), (probes, 1)]
        assert sought[1:] == [(probes, 0, 30), (probes, 1, 5)]
        # answers 1: offset 3 is the next to take and the end: nothing waits; sought ones wait again
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE + 2) == []
        # an idle partition: its last transaction's commit marker is all that follows what was taken
        ends_now[answers] = {0: 12, 1: 4}
        worker._heard_internal[(answers, 1)] = 0.0
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE + 3) == []
        assert asked == [(probes, [1])]  # the group's committed offset read only where it is not known

    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"{probes} partition 1: no record delivered" in w and "offsets 5..6 wait" in w for w in warnings)
    assert len(warnings) == 3


def test_a_partition_that_delivered_nothing_before_a_pause_is_sought_to_its_start_on_resume(assigned, monkeypatch):
    """Records fetched for a pages partition before the back-pressure paused it are dropped by
    faust; resuming sought only partitions that had delivered something, so a partition whose
    first records were all dropped resumed past them, and nothing later showed a hole."""
    worker = assigned
    topic = worker.settings.pages_topic
    sought: list[tuple[int, int]] = []

    async def seek(tp, offset: int) -> None:
        sought.append((tp.partition, offset))

    resumed: list = []
    monkeypatch.setattr(worker, "_seek", seek)
    monkeypatch.setattr(worker.app.consumer, "resume_partitions", lambda tps: resumed.append(set(tps)))
    tps = {TP(topic, 0), TP(topic, 1)}

    async def scenario() -> None:
        deliver(worker, 1, range(0, 3))  # partition 1 delivered 0..2; partition 0 (committed 100) nothing
        await worker._resume(tps, worker._generation)

    asyncio.run(scenario())
    assert sorted(sought) == [(0, 100), (1, 3)]
    assert resumed == [tps]


def test_an_emptied_set_of_active_partitions_no_longer_drains_every_partition():
    """faust hands aiokafka's Fetcher.fetched_records its live set of active partitions, and
    aiokafka drains every buffered partition when that set is empty: at a rebalance, with every
    partition paused, a fetch call still waiting drained records that faust then dropped
    (docs/faust-notes.md §9).  The worker's wrapper keeps a paused partition's records buffered."""
    from aiokafka.consumer.fetcher import Fetcher, FetchResult
    from aiokafka.consumer.subscription_state import Assignment
    from aiokafka.structs import TopicPartition
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    class Records:  # aiokafka's PartitionRecords, as FetchResult iterates it
        def __init__(self, offsets: range) -> None:
            self.next_fetch_offset, self.offsets = offsets[0], offsets

        def __iter__(self):
            for o in self.offsets:
                self.next_fetch_offset = o + 1
                yield o

    async def fetch(wrapped: bool, active: set) -> dict:
        tps = [TopicPartition("pages", 0), TopicPartition("pages", 1)]
        assignment = Assignment(tps)
        for tp in tps:
            assignment.state_value(tp).seek(10)
        buffered = {
            tp: FetchResult(tp, assignment=assignment, partition_records=Records(range(10, 13)), backoff=0)
            for tp in tps
        }
        fetcher = SimpleNamespace(
            _closed=False,
            _records=buffered,
            _subscriptions=SimpleNamespace(
                reassignment_in_progress=False, is_assigned=lambda tp: True, fetch_context=contextlib.nullcontext
            ),
            _notify=lambda future: None,
            _wait_consume_future=None,
        )
        fetcher.fetched_records = functools.partial(Fetcher.fetched_records, fetcher)
        thread = SimpleNamespace(consumer=SimpleNamespace(flow_active=True))
        call = AIOKafkaConsumerThread._fetch_records
        call = call if wrapped else call.__wrapped__
        got = await call(thread, SimpleNamespace(_fetcher=fetcher, _closed=False), active, timeout=0)
        return {tp.partition: list(records) for tp, records in got.items()} | {"left": len(fetcher._records)}

    assert asyncio.run(fetch(False, set())) == {0: [10, 11, 12], 1: [10, 11, 12], "left": 0}  # aiokafka's own
    assert asyncio.run(fetch(True, set())) == {"left": 2}  # every partition paused: nothing drained
    assert asyncio.run(fetch(True, {TopicPartition("pages", 1)})) == {1: [10, 11, 12], "left": 1}


def test_a_record_handed_out_while_recovery_seeks_reaches_its_agent_after_the_queues_are_cleared(worker):
    """faust's Recovery.on_recovery_completed sends on_rebalance_complete, resumes the stream
    partitions, awaits its seek of them to the committed offsets, and only then resumes the flow
    control, which clears every agent's queue.  A record faust handed out in between went into
    its agent's queue and was cleared, with faust's read offset past it: a probes or answers
    record lost for good (docs/faust-notes.md §9).  The worker suspends the flow control at
    on_rebalance_complete: faust's delivery of such a record (mode's FlowControlQueue.put, which
    acquires the flow control first, as faust's on_message does) waits and lands after the clear.
    The consumer's flow stays on: faust's real getmany still hands the fetch out (a stopped flow
    would drop it, standby changelog records and all)."""
    from aiokafka.structs import ConsumerRecord
    from mode.utils.queues import FlowControlQueue

    app, consumer = worker.app, worker.app.consumer
    tp = TP(worker.probes_topic.get_topic_name(), 0)
    record = ConsumerRecord(tp.topic, 0, 5, 1_700_000_000_000, 0, b"k", b"v", None, 1, 1, [])

    async def fetched(timeout: float):
        return {tp: [record]}, {tp}

    consumer._wait_next_records = fetched
    consumer.highwater = lambda tp: 6

    async def scenario() -> tuple[list[int], int, int]:
        queue: FlowControlQueue = FlowControlQueue(flow_control=app.flow_control, clear_on_resume=True)
        app.flow_control.resume()  # as recovery leaves it after reading the changelogs
        consumer.resume_flow()
        await app.on_rebalance_complete.send()  # recovery's first step as it ends
        consumer.resume_partitions({tp})
        handed = [m async for _, m in consumer.getmany(timeout=0)]  # a fetch returns during the seek
        put = asyncio.ensure_future(queue.put(handed[0]))  # faust delivers it to the probes agent
        await asyncio.sleep(0)  # (one turn: the put runs until it blocks, or queues and ends)
        queued_during_seek = queue.qsize()
        app.flow_control.resume()  # recovery, after its seek: clears every agent's queue
        await asyncio.wait_for(put, 5)
        return [m.offset for m in handed], queued_during_seek, queue.qsize()

    handed, during, after = app.loop.run_until_complete(scenario())  # (the loop faust bound its events to)
    assert handed == [5]
    assert during == 0  # held, not queued where the clear would drop it
    assert after == 1


def test_recovery_resumes_the_stream_partitions_only_after_the_assignments_seek(worker):
    """The assignment's seek of the partitions with no committed offset (``_seek_uncommitted``,
    started in the assignment callback, not awaited there) must land before faust's recovery
    resumes them.  Recovery used to take seconds (its offsets read behind faust's 1.5-s fetch) and
    the seek won by that margin; now that recovery reads them by a client of its own, its end
    waits for the seek: on_rebalance_complete, recovery's first step as it ends, returns only
    once the seek has."""
    app = worker.app

    async def scenario() -> tuple[bool, bool]:
        seek: asyncio.Future = asyncio.get_running_loop().create_future()
        worker._seek_task = seek
        complete = asyncio.ensure_future(app.on_rebalance_complete.send())
        await asyncio.sleep(0.2)
        waited = not complete.done()
        seek.set_result(None)  # the seek lands
        await asyncio.wait_for(complete, 5)
        app.flow_control.resume()
        return waited, complete.done()

    waited, ended = app.loop.run_until_complete(scenario())
    assert waited, "recovery went on while the assignment's seek was under way"
    assert ended


@pytest.mark.parametrize("processes", [1, 3])
def test_every_fingerprinting_process_gets_a_batch_of_a_backlog(tmp_path, monkeypatch, processes):
    """With N fingerprinting processes a backlog keeps N batches in the pool at once (and one more
    registering): with the fixed 2 batches in flight of before, processes beyond the first two sat
    idle.  The pool is threads here, so that the test can hold each batch in it and count them."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    gate, lock, inside, most = threading.Event(), threading.Lock(), [0], [0]
    real = app_module.fingerprint_contents

    def held(*args):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        gate.wait(10)
        with lock:
            inside[0] -= 1
        return real(*args)

    monkeypatch.setattr(pool_module, "fingerprint_pool", lambda n: ThreadPoolExecutor(n))
    monkeypatch.setattr(app_module, "fingerprint_contents", held)
    settings = Settings(data_dir=tmp_path, fingerprint_processes=processes, partitions=2, batch_size=10)
    worker = Worker(settings, registry=CollectorRegistry())
    worker.probes_topic = Topic()
    worker.outbox.schedule = lambda partition: None
    worker.outbox.owned = {0, 1}
    worker.outbox.assign({0, 1})
    worker.outbox.start(0, 0)

    async def scenario() -> None:
        deliver(worker, 0, range(0, 100))  # ten batches
        await until(lambda: most[0] >= processes, f"{processes} batches in the pool")
        await asyncio.sleep(0.2)  # (time for one batch too many to get in)
        assert most[0] == processes
        assert worker._in_flight == max(2, processes + 1)
        gate.set()  # (no answers come: the pages wait for them, up to the back-pressure limit)
        limit = worker._max_waiting
        assert limit == max(2, processes + 1) * 10
        judged = lambda: waiting_offsets(worker, 0)  # noqa: E731
        await until(lambda: len(judged()) >= limit and not worker._in_flight, "the first batches judged")
        assert judged() == list(range(len(judged())))  # in order

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
        worker.close()


def test_a_fenced_output_producer_of_an_owned_partition_stops_the_worker(worker, monkeypatch):
    crashes: list[BaseException] = []

    async def crash(e: BaseException) -> None:
        crashes.append(e)

    monkeypatch.setattr(worker.app, "crash", crash)

    async def scenario() -> None:
        assert worker.outbox.on_fenced is not None
        worker.outbox.on_fenced(1)
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert len(crashes) == 1 and "pages partition 1 was fenced" in str(crashes[0])


def test_large_pages_pause_the_partitions_by_their_bytes_in_smaller_batches(assigned, monkeypatch):
    """Back-pressure counted records only: 2 x batches in flight x --batch-size records (2,000)
    of pages legal up to --max-page-bytes (5 MiB) held ~10 GiB before a pause.  Now the bytes
    held also pause the partitions and stop new batches, and a batch takes at most BATCH_BYTES."""
    worker = assigned
    monkeypatch.setattr(app_module, "MAX_HELD_BYTES", 4 << 20)
    monkeypatch.setattr(app_module, "BATCH_BYTES", 1 << 20)
    paused: list[set] = []
    worker._assigned = {TP(worker.settings.pages_topic, 0)}
    monkeypatch.setattr(
        worker.app, "consumer", SimpleNamespace(pause_partitions=paused.append, resume_partitions=lambda tps: None)
    )
    sizes = batch_sizes(worker, monkeypatch)

    def big(offset: int) -> Event:
        page = {"url": f"http://big.test/{offset}", "content": f"<p>page {offset} words</p>" + "x" * (256 << 10)}
        return Event(Message(0, offset, page["url"].encode(), json.dumps(page).encode()))

    async def scenario() -> None:
        for offset in range(100, 160):  # no answers come: nothing is released
            if paused:
                break
            worker._deliver(big(offset))
            await asyncio.sleep(0)
        await until(lambda: not worker._in_flight, "the batches judged", worker=worker)

    asyncio.run(scenario())
    assert paused and len(worker.pending) + len(worker._buffer) < 2 * worker._max_waiting  # by bytes, not count
    held = worker.pending.bytes + worker._buffered_bytes
    assert held == sum(_size(e) for e in worker._buffer) + sum(
        len(w.value) for part in worker.pending._parts.values() for w in part.values()
    )
    assert held < (4 << 20) + 2 * (1 << 20)  # (the limit, plus the batches that were under way)
    assert sizes and max(sizes) <= 4  # 1 MiB of 256 KiB pages


def test_a_backlog_starts_with_a_small_batch_and_doubles_to_the_batch_size(assigned, monkeypatch):
    """Records handed over a whole fetch at a time (stream/direct_delivery.py) filled the first
    batch of a backlog at once: 500 pages fingerprinted before the first verdict, 1.3-1.9 s into
    a backlog on 2 cores.  An idle pipeline now starts with FIRST_BATCH pages and doubles."""
    worker = assigned
    sizes = batch_sizes(worker, monkeypatch)
    size, first = worker.settings.batch_size, app_module.FIRST_BATCH
    ramp = [min(size, first << i) for i in range(5)]
    ramp = ramp[: ramp.index(size) + 1] if size in ramp else ramp

    async def scenario() -> None:
        for e in events(1, range(0, sum(ramp))):  # no answers come: the pipeline never empties again
            worker._deliver(e)
        await until(lambda: sum(sizes) == sum(ramp) and not worker._in_flight, "the batches judged", worker=worker)

    asyncio.run(scenario())
    assert first < size and sizes == ramp
    assert waiting_offsets(worker, 1) == list(range(sum(ramp)))
