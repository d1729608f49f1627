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

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry

from streamdedup.settings import Settings
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


def test_a_record_skipped_between_two_delivered_ones_is_read_again_once(worker):
    """faust can deliver offset 6 and drop 5 (a back-pressure resume racing the consumer's
    current batch, docs/faust-notes.md §10): the worker seeks back to 5, and a hole that is
    still there after that one re-read (transaction markers) is let be."""
    pages = worker.settings.pages_topic
    worker._assigned = {TP(pages, 2)}
    seeks: list[tuple[int, int]] = []

    async def reread(tp, offset, generation):
        seeks.append((tp.partition, offset))

    worker._reread = reread

    def deliver(offset: int) -> None:  # what the pages agent does with each event
        worker._check_hole(2, offset)
        worker._seen[2] = max(worker._seen.get(2, 0), offset + 1)

    async def scenario() -> None:
        for offset in (3, 4, 6):
            deliver(offset)
        await asyncio.sleep(0)
        assert seeks == [(2, 5)]
        for offset in (5, 6, 7):  # the re-read: nothing new is missing
            deliver(offset)
        deliver(9)  # a hole at 8 again after its re-read: re-read once more, for 8
        deliver(8)
        deliver(9)
        deliver(11)  # a marker at 10: re-read once...
        await asyncio.sleep(0)
        assert seeks == [(2, 5), (2, 8), (2, 10)]
        worker._seen[2] = 10  # ...and after the seek 11 comes again without 10: let be
        deliver(11)
        await asyncio.sleep(0)
        assert seeks == [(2, 5), (2, 8), (2, 10)]

    asyncio.run(scenario())
