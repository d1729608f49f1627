"""The pages stage across a rebalance, without a broker: a Worker whose Kafka sends are stubbed.

These pin the cause of the records lost after a SIGKILL under load (docs/faust-notes.md §8): a
pages batch taken before a revocation ran its duplicate check after it, so the next assignment
believed it had already taken offsets it never judged, and skipped them when faust read the
partition again from the committed offset.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
from streamdedup.stream import app as app_module
from streamdedup.stream.app import Worker


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


@pytest.fixture
def worker(tmp_path):
    w = Worker(Settings(data_dir=tmp_path, fingerprint_processes=0, partitions=2), registry=CollectorRegistry())
    w.probes_topic = Topic()  # no Kafka: probes are counted, flushes never run
    w.outbox.schedule = lambda partition: None
    w.outbox.owned = {0, 1}
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


def test_a_hole_that_cannot_be_read_is_given_up_after_bounded_retries(assigned, caplog):
    worker = assigned
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
        await until(lambda: len(worker.pending) >= limit and not worker._in_flight, "the backlog full")
        deliver(worker, 1, range(1, 50))
        assert worker._buffer and not waiting_offsets(worker, 1)  # no new batch starts now
        gate.set()  # the hole's read returns
        await until(lambda: 0 in waiting_offsets(worker, 1), "0 judged")
        assert waiting_offsets(worker, 1) == [0]  # (the rest still held back: only the hole was judged)
        assert worker.outbox.tracker(1).committable(waiting_offsets(worker, 1)) == 1

    asyncio.run(scenario())


def test_records_after_a_hole_wait_for_it_and_are_judged_in_offset_order(assigned):
    """A page is stored where its offset puts it, also when the consumer skipped a record before
    it (the order rule: with one partition the verdicts are scan's on the partition's order)."""
    worker = assigned
    worker.outbox.read_range, reads = reader(1, set(range(10)))
    order: list[tuple[int, int]] = []
    add_page = worker.pending.add_page

    def registered(partition: int, offset: int, **kwargs):
        order.append((partition, offset))
        return add_page(partition, offset, **kwargs)

    worker.pending.add_page = registered  # type: ignore[method-assign]

    async def scenario() -> None:
        deliver(worker, 1, [0, 1, 2, 4, 5])
        await until(lambda: waiting_offsets(worker, 1) == [0, 1, 2, 3, 4, 5], "3, 4 and 5 judged", worker=worker)
        assert order == [(1, o) for o in range(6)]

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
    monkeypatch.setattr(worker, "_pages_ends", ends)
    recovery = SimpleNamespace(completed=SimpleNamespace(is_set=lambda: True))
    monkeypatch.setattr(worker.app, "tables", SimpleNamespace(recovery=recovery))
    worker._heard_pages = {0: 0.0, 1: 0.0}

    async def scenario() -> None:
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE / 2) == []  # not silent long enough
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE) == [0]
        assert sought == [(0, 100)]
        # sought: it gets another PARTITION_SILENCE before the next try
        assert await worker.reseek_stalled(now=app_module.PARTITION_SILENCE + 1) == []
        worker._paused = True  # the worker's own back-pressure: silence is expected
        assert await worker.reseek_stalled(now=3 * app_module.PARTITION_SILENCE) == []

    asyncio.run(scenario())
