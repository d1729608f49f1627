"""A record the consumer never delivers is read by the worker and judged, never committed past
(docs/faust-notes.md §10); an offset with no record (a transaction marker) is skipped.

The skip is provoked with the worker's test hook ``TEST_STREAMDEDUP_FAULT=skip:<partition>:<offset>``
(``streamdedup/stream/app.py``), which drops that record the first time the consumer delivers it,
as faust does when a stale fetch has raised its read offset past a re-fetched record.  Every check reads
every output topic to its end offsets: each input record has exactly one outcome.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import urllib.request

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from stream_harness import StreamTopics, WorkerProcess, page_record, produce, wait_until_committed
from topics import outcomes_by_offset as outcomes

from streamdedup.pipeline.pending import Pending
from streamdedup.pipeline.routing import Topics
from streamdedup.settings import Settings
from streamdedup.stream.app import FAULT_ENV
from streamdedup.stream.outbox import Outbox

pytestmark = pytest.mark.kafka


def pages(prefix: str, n: int, rng: random.Random) -> list[dict]:
    return [
        page_record(
            f"http://holes.test/{prefix}/{i}",
            "<p>" + " ".join(f"w{rng.randrange(20000)}" for _ in range(120)) + "</p>",
            id=f"{prefix}-{i}",
        )
        for i in range(n)
    ]


def wait_for_all(kafka, topics: StreamTopics, worker: WorkerProcess, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found, _ = outcomes(kafka, topics)
        if all(found.values()):
            return found
        assert time.monotonic() < deadline, (
            f"no outcome for {[po for po, o in found.items() if not o]}:\n{worker.log_tail()}"
        )
        time.sleep(0.5)


def skipped_metric(worker: WorkerProcess, why: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    m = re.search(rf'^streamdedup_offsets_skipped_total\{{why="{why}"\}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0


def commit(kafka, topics: StreamTopics, offsets: dict[int, int]) -> None:
    """Commit pages offsets for the worker's group, as an earlier worker would have."""

    async def run() -> None:
        c = AIOKafkaConsumer(**kafka.client_kwargs(), group_id=topics.app_id, enable_auto_commit=False)
        await c.start()
        try:
            tps = {p: TopicPartition(topics.pages, p) for p in offsets}
            c.assign(list(tps.values()))
            await c.commit({tps[p]: o for p, o in offsets.items()})
        finally:
            await c.stop()

    asyncio.run(run())


def test_records_the_consumer_skipped_at_assignment_are_read_and_judged(kafka, tmp_path):
    """The first record delivered after the assignment is beyond the committed offset (partition 0
    starts at 1), and a record is missing between two delivered ones (partition 1, offset 7): the
    old worker committed past offset 0 of partition 0, and it had no outcome.

    The group has committed offsets (0) before the worker starts, as after an earlier worker: a
    partition with none is sought to its start, and that seek delivers the dropped record again
    before the hole is read, on a slow machine (then this test checked nothing)."""
    topics = StreamTopics.fresh(kafka, partitions=2)
    records = pages("a", 30, random.Random(1))
    produce(kafka, topics.pages, records, partitions=[i % 2 for i in range(len(records))])
    commit(kafka, topics, {0: 0, 1: 0})
    with WorkerProcess(kafka, topics, tmp_path, env={FAULT_ENV: "skip:0:0,1:7"}) as worker:
        found = wait_for_all(kafka, topics, worker)
        assert wait_until_committed(kafka, topics, timeout=60), worker.log_tail()
        assert skipped_metric(worker, "empty") == 0 and skipped_metric(worker, "unread") == 0
        log = worker.log_path.read_text()
    for partition, offset in [(0, 0), (1, 7)]:
        assert f"test hook TEST_STREAMDEDUP_FAULT: dropping pages offset {offset} of partition {partition}" in log
        assert f"partition {partition}: 1 offsets from {offset} to" in log
        assert f"partition {partition}: 1 records read again ({offset})" in log
    assert len(found) == 30 and all(len(o) == 1 for o in found.values()), found


def test_transaction_markers_in_the_pages_topic_are_committed_past(kafka, tmp_path):
    """A producer writing the pages in transactions leaves a marker after each: an offset with no
    record.  The worker reads it, finds nothing, and commits past it."""
    topics = StreamTopics.fresh(kafka, partitions=1)
    rng = random.Random(2)

    async def transactions() -> None:
        p = AIOKafkaProducer(**kafka.client_kwargs(), transactional_id=f"{topics.app_id}-crawler")
        await p.start()
        try:
            for t in range(2):  # records 0-4, marker 5, records 6-10, marker 11
                async with p.transaction():
                    for r in pages(f"t{t}", 5, rng):
                        await p.send(topics.pages, json.dumps(r).encode(), key=r["id"].encode(), partition=0)
        finally:
            await p.stop()

    asyncio.run(transactions())
    produce(kafka, topics.pages, pages("after", 3, rng), partitions=[0, 0, 0])  # records 12-14
    with WorkerProcess(kafka, topics, tmp_path) as worker:
        found = wait_for_all(kafka, topics, worker)
        assert wait_until_committed(kafka, topics, timeout=60), worker.log_tail()
        assert skipped_metric(worker, "empty") == 2 and skipped_metric(worker, "unread") == 0
        log = worker.log_path.read_text()
    assert "hold no record (transaction markers or compaction); skipped" in log
    assert sorted(found) == [(0, o) for o in [*range(5), *range(6, 11), *range(12, 15)]]
    assert all(len(o) == 1 for o in found.values()), found

    # the outbox's own reads, as the worker uses them: a range across a marker, the committed offsets
    def outbox(app_id: str) -> Outbox:
        settings = Settings(brokers=(kafka.bootstrap,), app_id=app_id, pages_topic=topics.pages)
        return Outbox(settings, Topics("u", "n", "v", "d"), Pending(n_groups=1))

    records, reached = asyncio.run(outbox(topics.app_id).read_range(0, 4, 7))
    assert ([r.offset for r in records], reached) == ([4, 6, 7], True)
    records, reached = asyncio.run(outbox(topics.app_id).read_range(0, 13, 20, timeout=3.0))
    assert ([r.offset for r in records], reached) == ([13, 14], False)  # (20 is not written yet)
    assert asyncio.run(outbox(topics.app_id).read_committed([0])) == {0: 15}
    assert asyncio.run(outbox(f"{topics.app_id}-none").read_committed([0])) == {0: 0}  # none: the beginning
